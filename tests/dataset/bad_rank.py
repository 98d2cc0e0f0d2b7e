"""One rank of a multi-process job over planted faults (run by test_bad_samples_multiprocess.py).

Three MDS streams, each with one fault (a record that does not decode in a zstd shard, a
truncated shard, a flipped byte under validate_hash), and a transform that raises a listed
ValueError on one sample: read with ``on_bad_sample="skip"`` through a Loader with worker
processes (each bad sample's log line goes to stderr, from whichever process read it).
Writes the rank's planned and received batches, its stats' bad samples and (with
``--take``) the state after that many batches.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).parent))

from astream import Loader, Stream, StreamingDataset

STREAMS = ("zstd", "truncated", "flipped")
ODD = 100 + 21  # a sample of the second stream whose transform raises


def odd_one_out(sample: dict[str, Any]) -> dict[str, Any]:
    if int(sample["id"]) == ODD:
        raise ValueError(f"sample {ODD} is odd")
    return sample


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--remote", required=True)
    parser.add_argument("--cache", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--take", type=int, default=None)
    parser.add_argument("--resume", default=None)
    parser.add_argument("--budget", type=int, default=100)
    parser.add_argument("--kind", default="mds", help="mds (three streams and a transform), jsonl, parquet, webdataset")
    args = parser.parse_args()
    rank, per_node = int(os.environ["RANK"]), int(os.environ["LOCAL_WORLD_SIZE"])
    node = os.path.join(args.cache, f"node{rank // per_node}")
    skip = {"on_bad_sample": "skip", "max_bad_samples": args.budget}
    if args.kind == "mds":
        streams = [Stream(remote=f"{args.remote}/{name}", local=os.path.join(node, name)) for name in STREAMS]
        ds = StreamingDataset(streams=streams, shuffle=True, shuffle_seed=7, batch_size=4, validate_hash="xxh64",
                              skip_exceptions=(ValueError,), transform=odd_one_out, **skip)
    else:  # one stream of that format, its own fault
        fmt = {"jsonl": None}.get(args.kind, args.kind)
        ds = StreamingDataset(remote=f"{args.remote}/{args.kind}", local=os.path.join(node, args.kind), format=fmt,
                              shuffle=True, shuffle_seed=7, batch_size=4, **skip)
    loader = Loader(ds, num_workers=args.workers)
    if args.resume:
        loader.load_state_dict(json.loads(Path(args.resume).with_suffix(f".rank{rank}.json").read_text()))
    planned = [[int(i) for i in b] for b in loader.batch_ids(ds.current_epoch)]
    got: list[list[int]] = []
    state = None
    error = None
    try:
        for batch in loader:
            got.append([int(str(k).rsplit("/", 1)[1]) for k in batch["__key__"]] if "__key__" in batch
                       else [int(i) for i in batch["id"]])
            if args.take is not None and len(got) == args.take:
                state = loader.state_dict()
                break
    except Exception as exc:
        error = f"{type(exc).__name__}: {exc}"
    stats = loader.stats()
    loader.close()
    ds.close()
    Path(args.out).write_text(json.dumps({
        "planned": planned, "got": got, "state": state, "error": error,
        "quarantined": [list(q) for q in stats.quarantined], "bad_samples": stats.bad_samples,
    }))


if __name__ == "__main__":
    main()
