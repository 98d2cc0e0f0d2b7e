"""One rank of a multi-process Parquet or WebDataset job (run by test_formats_multiprocess.py).

Like rank_main.py, over a ``--format`` stream; every sample it reads is compared with the
truth (pyarrow's own read of the Parquet files in ``--truth``, or the members the tar
writer of test_webdataset_streams.py wrote), and the mismatches are reported.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))

import parquet_data as data
from test_webdataset_streams import members

from astream._dataset.dataset import StreamingDataset
from astream._dataset.loader import Loader


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--remote", required=True)
    parser.add_argument("--format", default="parquet")
    parser.add_argument("--truth", required=True, help="the folder of the Parquet files, read with pyarrow")
    parser.add_argument("--cache", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--take", type=int, default=None)
    parser.add_argument("--resume", default=None)
    args = parser.parse_args()
    parquet = args.format == "parquet"
    truth = data.truth(sorted(Path(args.truth).glob("*.parquet"))) if parquet else {}
    rank, per_node = int(os.environ["RANK"]), int(os.environ["LOCAL_WORLD_SIZE"])
    ds = StreamingDataset(remote=args.remote, local=os.path.join(args.cache, f"node{rank // per_node}"),
                          format=args.format, shuffle=True, shuffle_seed=11, batch_size=16)
    loader = Loader(ds, num_workers=args.workers)
    if args.resume:
        loader.load_state_dict(json.loads(Path(args.resume).read_text()))
    ids: list[int] = []
    bad: list[int] = []
    state = None
    for n, batch in enumerate(loader, start=1):
        for row in data.rows(batch):
            if parquet:
                ids.append(row["id"])
                if not data.same(row, truth[row["id"]]):
                    bad.append(row["id"])
            else:
                i = int(row.pop("__key__").rsplit("/", 1)[1])
                ids.append(i)
                if {k: v for k, v in row.items() if v is not None} != members(i):
                    bad.append(i)
        if args.take is not None and n == args.take:
            state = loader.state_dict()
            break
    ds.close()
    Path(args.out).write_text(json.dumps({"ids": ids, "bad": bad, "state": state}))


if __name__ == "__main__":
    main()
