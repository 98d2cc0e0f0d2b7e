"""One rank of a job with a small cache_limit (run as a subprocess by test_bounded_cache.py).

Reads its place from RANK/WORLD_SIZE/LOCAL_RANK/LOCAL_WORLD_SIZE, iterates one epoch
through a Loader, and writes the ids it saw and (rank 0, once every rank of the node is
done) the node agent's counters as JSON. ``--die-after N`` kills the process (SIGKILL)
after N batches, as a crashed rank would go.
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import warnings

from astream._dataset.dataset import StreamingDataset
from astream._dataset.loader import Loader
from astream._dataset.runtime import portal
from astream._dataset.session import main_member as _main_member
from astream.errors import CacheWarning


async def node_stats(ds: StreamingDataset, ranks: int, wait: bool) -> dict:
    node = await ds.node()
    if wait:
        await node.barrier("bounded-done", [_main_member(r) for r in range(ranks)])
    return await node.stats()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--remote", required=True)
    parser.add_argument("--cache", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--batch-size", type=int, default=4)
    parser.add_argument("--limit", type=int, required=True)
    parser.add_argument("--algo", default="py1e")
    parser.add_argument("--block", type=int, default=None)
    parser.add_argument("--predownload", type=int, default=None)
    parser.add_argument("--die-after", type=int, default=None)
    args = parser.parse_args()
    warnings.simplefilter("ignore", CacheWarning)
    rank, per_node = int(os.environ["RANK"]), int(os.environ["LOCAL_WORLD_SIZE"])
    ds = StreamingDataset(remote=args.remote, local=args.cache, shuffle=True, shuffle_seed=7,
                          shuffle_algo=args.algo, shuffle_block_size=args.block, batch_size=args.batch_size,
                          cache_limit=args.limit, predownload=args.predownload)
    ids: list[int] = []
    for n, batch in enumerate(Loader(ds, num_workers=args.workers), start=1):
        ids.extend(int(i) for i in batch["id"])
        if args.die_after is not None and n == args.die_after:
            os.kill(os.getpid(), signal.SIGKILL)
    stats = portal().call(node_stats(ds, per_node, wait=os.environ.get("BOUNDED_WAIT") == "1"))
    ds.close()
    with open(args.out, "w") as f:
        json.dump({"ids": ids, "stats": stats if rank == 0 else None}, f)


if __name__ == "__main__":
    main()
