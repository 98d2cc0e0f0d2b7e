"""One rank of a multi-process Parquet job (run as a subprocess by test_parquet_multiprocess.py).

Like rank_main.py, over a Parquet stream; every row it reads is compared with pyarrow's
own read of the source files (``--truth``), and the mismatches are reported.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import parquet_data as data

from astream._dataset.dataset import StreamingDataset
from astream._dataset.loader import Loader


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--remote", required=True)
    parser.add_argument("--truth", required=True, help="the folder of the Parquet files, read with pyarrow")
    parser.add_argument("--cache", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--take", type=int, default=None)
    parser.add_argument("--resume", default=None)
    args = parser.parse_args()
    truth = data.truth(sorted(Path(args.truth).glob("*.parquet")))
    rank, per_node = int(os.environ["RANK"]), int(os.environ["LOCAL_WORLD_SIZE"])
    ds = StreamingDataset(remote=args.remote, local=os.path.join(args.cache, f"node{rank // per_node}"),
                          format="parquet", shuffle=True, shuffle_seed=11, batch_size=16)
    loader = Loader(ds, num_workers=args.workers)
    if args.resume:
        loader.load_state_dict(json.loads(Path(args.resume).read_text()))
    ids: list[int] = []
    bad: list[int] = []
    state = None
    for n, batch in enumerate(loader, start=1):
        for row in data.rows(batch):
            ids.append(row["id"])
            if not data.same(row, truth[row["id"]]):
                bad.append(row["id"])
        if args.take is not None and n == args.take:
            state = loader.state_dict()
            break
    ds.close()
    Path(args.out).write_text(json.dumps({"ids": ids, "bad": bad, "state": state}))


if __name__ == "__main__":
    main()
