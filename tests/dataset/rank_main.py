"""One rank of a multi-process test job (run as a subprocess by test_multiprocess.py).

Reads its place from RANK/WORLD_SIZE/LOCAL_RANK/LOCAL_WORLD_SIZE like any launched job,
iterates one epoch through a Loader (optionally stopping after some batches and saving
the state), and writes what it saw as JSON.
"""

from __future__ import annotations

import argparse
import json
import os

from astream._dataset.dataset import StreamingDataset
from astream._dataset.loader import Loader
from astream._dataset.stream import Stream


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--remote", default=None)
    parser.add_argument("--streams", default=None, help="Stream keywords (JSON list) instead of --remote; each "
                        "stream is cached in the node's folder under its 'name'")
    parser.add_argument("--cache", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--take", type=int, default=None, help="stop after this many batches and save state")
    parser.add_argument("--resume", default=None, help="a state file to resume from")
    parser.add_argument("--options", default="{}", help="StreamingDataset keywords (JSON) over the defaults")
    args = parser.parse_args()
    rank, per_node = int(os.environ["RANK"]), int(os.environ["LOCAL_WORLD_SIZE"])
    node = rank // per_node
    options = {"shuffle": True, "shuffle_seed": 7, "batch_size": args.batch_size, **json.loads(args.options)}
    local = os.path.join(args.cache, f"node{node}")
    if args.streams:
        streams = [Stream(local=os.path.join(local, s.pop("name")), **s) for s in json.loads(args.streams)]
        ds = StreamingDataset(streams=streams, **options)
    else:
        ds = StreamingDataset(remote=args.remote, local=local, **options)
    loader = Loader(ds, num_workers=args.workers)
    if args.resume:
        with open(args.resume) as f:
            loader.load_state_dict(json.load(f))
    ids: list[int] = []
    batches: list[list[int]] = []
    state = None
    for n, batch in enumerate(loader, start=1):
        batches.append([int(i) for i in batch["id"]])
        ids.extend(batches[-1])
        if args.take is not None and n == args.take:
            state = loader.state_dict()
            break
    ds.close()
    with open(args.out, "w") as f:
        json.dump({"ids": ids, "batches": batches, "state": state, "len": len(ds)}, f)


if __name__ == "__main__":
    main()
