"""Internal floor (astream._cache.simulation's offline optimum): a dataset larger than the cache, issue 14.

One node, ``--ranks`` rank processes (direct iteration, a py1e shuffle at MosaicML's default
block size and at ``--small-block``), the dataset behind the loopback server, and
``cache_limit`` at fractions of the dataset. Each run reports the bytes downloaded in the
epoch (counted by the server), the epoch's wall time, and the floor: the offline optimum
(Belady with the node's whole plan, from ``astream.sampling.EpochPlan``) and the plan-aware
policy's own simulation, with the ratio to the optimum; every run checks that each rank read
exactly its plan's order. ``--libs mosaicml`` runs mosaicml-streaming's ranks too (the same
py1e order, the same ``cache_limit``, its S3 client at the same server).

    python benchmarks/cache_bench.py --runs 1
    python benchmarks/cache_bench.py --limits 0.1 0.25 0.5 --peer-python mosaicml=PATH
"""

from __future__ import annotations

import json
import statistics
from typing import Any

from _harness import Bench, Metric, Server, data, fmt, parser

from astream._cache.eviction import min_cache_bytes
from astream._cache.simulation import offline_optimum, simulate
from astream.sampling import EpochPlan

NCN = 1  # one canonical node on both sides: the orders compared are the same
EPOCH = Metric("epoch s", lambda r: max(x["seconds"] for x in r["result"]), higher=False, spec=".2f")


def main() -> None:
    p = parser(__doc__, "cache", libs=("astream", "mosaicml"), runs=1)
    p.add_argument("--shards", type=int, default=240)
    p.add_argument("--ranks", type=int, default=4)
    p.add_argument("--batch", type=int, default=4)
    p.add_argument("--limits", type=float, nargs="*", default=[0.1, 0.25, 0.5])
    p.add_argument("--small-block", type=int, default=1200)
    args = p.parse_args()
    bench = Bench("cache", args)
    # 16 samples of 2 KB a shard: many small shards, so that eviction decides the downloads.
    folder = data.mds(bench.data, "cache", "blobs", int(args.shards * 16 * args.scale), "33kb")
    index = json.loads((folder / "index.json").read_text())
    sizes = [s["raw_data"]["bytes"] for s in index["shards"]]
    total = sum(sizes)
    floors: dict[tuple[Any, ...], tuple[int, int, list[list[int]]]] = {}
    with Server(bench.data, args.bandwidth) as server:
        for block in (None, args.small_block):
            plan = EpochPlan([{"shard_sizes": [s["samples"] for s in index["shards"]]}], shuffle=True,
                             shuffle_algo="py1e", num_canonical_nodes=NCN, shuffle_block_size=block,
                             batch_size=args.batch, num_physical_nodes=1, ranks_per_node=args.ranks,
                             workers_per_rank=1)
            orders = [plan.shard_of(ids[ids >= 0]) for ids in (plan.worker_ids(0, r, 0) for r in range(args.ranks))]
            expected = [plan.rank_order(0, r).tolist() for r in range(args.ranks)]
            for fraction in args.limits:
                limit = int(total * fraction)
                opt = offline_optimum(orders, sizes, limit, batch_size=args.batch).bytes_downloaded
                sim = simulate(orders, sizes, limit, batch_size=args.batch, predownload=8 * args.batch).bytes_downloaded
                config = {"block": block or plan.shuffle_block_size, "limit": fraction}
                floors[tuple(config.values())] = (opt, sim, expected)
                for side in args.libs:
                    bench.add(config, side, "mds", "ids",
                              {"lib": side, "remote": server.url(folder) if side == "astream" else server.s3(folder),
                               "local": "{cache}", "batch": args.batch, "cache_limit": limit, "block": block,
                               "canonical_nodes": NCN}, server.s3_env() if side == "mosaicml" else None,
                              ranks=args.ranks)
        seen = 0
        for case in list(bench.cases):  # one case at a time, so that the server's log tells its downloads
            bench.cases = [case]
            bench.run()
            log = server.requests()
            for r in bench.records[-args.runs:]:
                r["downloaded"] = sum(sizes[int(path.rsplit(".", 2)[-2])] for method, path, rng in log[seen:]
                                      if method == "GET" and ".mds" in path and rng is None) / args.runs
            seen = len(log)
    rows = []
    for config in bench.configs():
        opt, sim, expected = floors[tuple(config.values())]
        for side in args.libs:
            runs = [r for r in bench.records if r["config"] == config and r["side"] == side]
            if not runs:
                continue
            exact = all([x["ids"] for x in r["result"]] == expected for r in runs)
            got = statistics.median(r["downloaded"] for r in runs)
            rows.append([config["block"], config["limit"], side, f"{got / 1e6:.2f}", f"{opt / 1e6:.2f}",
                         f"{sim / 1e6:.2f}", f"{got / opt:.3f}x" if opt else "-",
                         fmt(bench.median(config, side, EPOCH), ".2f"), "yes" if exact else "NO"])
    bench.table(f"{len(sizes)} shards, {total / 1e6:.1f} MB; {args.ranks} ranks, batch {args.batch}; minimum cache "
                f"{min_cache_bytes(sizes, args.batch, args.ranks) / 1e6:.2f} MB; load {bench.loads()}",
                ["block", "limit", "side", "downloaded MB", "optimum MB", "simulated MB", "vs optimum",
                 "epoch s", "exact order"], rows)


if __name__ == "__main__":
    main()
