"""One rank of a job whose datasets share one ``local`` (run as a subprocess by test_identity.py).

Reads its place from RANK/WORLD_SIZE/LOCAL_RANK/LOCAL_WORLD_SIZE/ASTREAM_RUN_ID like any
launched job. Builds every dataset of ``--spec`` on the same ``local`` (a train and a val
split, say), iterates each for ``epochs`` epochs through a Loader with worker processes,
and writes, per dataset and epoch, the ids it saw and whether every sample's bytes were
those of its id. With ``delete`` (``[epoch, batch]``), local rank 0 removes every shard
file of the folder after that many batches of that epoch (``batch`` 0: before it), as a
cleaner of the temporary folder would.
"""

from __future__ import annotations

import argparse
import contextlib
import glob
import json
import os
import warnings

import numpy as np

from astream._dataset.dataset import StreamingDataset
from astream._dataset.loader import Loader
from astream.errors import CacheWarning


def remove_shards(local: str) -> int:
    gone = 0
    for path in glob.glob(os.path.join(local, "**", "shard.*.mds"), recursive=True):  # (installed ones)
        with contextlib.suppress(FileNotFoundError):  # (evicted meanwhile)
            os.unlink(path)
            gone += 1
    return gone


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--spec", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args()
    spec = json.loads(args.spec)
    warnings.simplefilter("ignore", CacheWarning)  # (a small cache thrashes: that is the point)
    local_rank = int(os.environ["LOCAL_RANK"])
    options = {"shuffle": True, "shuffle_seed": 7, "batch_size": spec.get("batch_size", 4)}
    if spec.get("cache_limit"):
        options["cache_limit"] = spec["cache_limit"]
    datasets = {d["name"]: StreamingDataset(remote=d["remote"], local=spec["local"], split=d.get("split"), **options)
                for d in spec["datasets"]}
    delete = spec.get("delete")
    out: dict[str, list[list[int]]] = {name: [] for name in datasets}
    right = True
    removed = 0
    for epoch in range(spec.get("epochs", 1)):
        for name, ds in datasets.items():
            loader = Loader(ds, num_workers=spec.get("workers", 0))
            ids: list[int] = []
            if delete == [epoch, 0] and local_rank == 0 and name == spec["datasets"][0]["name"]:
                removed += remove_shards(spec["local"])
            for n, batch in enumerate(loader, start=1):
                batch_ids = np.asarray(batch["id"])
                ids.extend(int(i) for i in batch_ids)
                right &= bool((np.asarray(batch["x"])[:, 0] == batch_ids % 251).all())
                if delete == [epoch, n] and local_rank == 0 and name == spec["datasets"][0]["name"]:
                    removed += remove_shards(spec["local"])
            out[name].append(ids)
    for ds in datasets.values():
        ds.close()
    with open(args.out, "w") as f:
        json.dump({"ids": out, "right": right, "removed": removed}, f)


if __name__ == "__main__":
    main()
