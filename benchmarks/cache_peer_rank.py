"""One rank of mosaicml-streaming for benchmarks/cache_bench.py ``--peer`` (run in the peer's venv).

No astream import: it runs in a separate virtual environment with torch and
mosaicml-streaming 0.13 (see docs/bench/peer.md). The remote is ``s3://`` at the
benchmark's loopback server (``S3_ENDPOINT_URL``); torch.distributed (gloo) joins the
ranks, as the peer requires with ``WORLD_SIZE > 1``. Writes the ids it read and its
epoch time as JSON.
"""

from __future__ import annotations

import argparse
import json
import time

from peer_stub import stub_streaming_vision


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--remote", required=True)
    parser.add_argument("--cache", required=True)
    parser.add_argument("--out", required=True)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--limit", type=int, required=True)
    parser.add_argument("--block", type=int, default=None)
    args = parser.parse_args()
    stub_streaming_vision()
    import streaming

    ds = streaming.StreamingDataset(remote=args.remote, local=args.cache, shuffle=True, shuffle_algo="py1e",
                                    shuffle_block_size=args.block, batch_size=args.batch, cache_limit=args.limit)
    start = time.perf_counter()
    ids = [int(sample["id"]) for sample in ds]
    took = time.perf_counter() - start
    with open(args.out, "w") as f:
        json.dump({"ids": ids, "seconds": took}, f)


if __name__ == "__main__":
    main()
