"""Time and peak memory of planning one epoch: astream against mosaicml-streaming, the same inputs.

Each case is a fresh process (its peak RSS its own): the whole world's sample ids of one
epoch (``work``: astream's ``EpochPlan.work()``, mosaicml's ``generate_work`` steps for
``random`` batching), one worker's (``worker``: astream's ``EpochPlan.worker_ids``) and the
shuffle alone (``shuffle``), over ``--samples`` samples in ``--shards`` uneven shards; the
digests of both libraries' ids must be equal. ``--what remix`` (astream alone): one worker's
ids of an epoch whose mixture changed twice, its earlier segments replayed (issue 36).

    python benchmarks/plan_bench.py --runs 3                 # 100M samples in 100k shards
    python benchmarks/plan_bench.py --samples 10_000_000 --shards 10_000
    python benchmarks/plan_bench.py --libs astream --what worker remix --samples 10_000_000 --shards 10_000
"""

from __future__ import annotations

from _harness import Bench, Metric, fmt, parser, ratio

METRICS = [
    Metric("seconds", lambda r: r["result"]["seconds"], higher=False, spec=".2f"),
    Metric("peak RSS MB", lambda r: r["result"]["peak_rss_mb"], higher=False),
    Metric("RSS growth MB", lambda r: r["result"]["delta_rss_mb"], higher=False),
]


def main() -> None:
    p = parser(__doc__, "plan", libs=("astream", "mosaicml"))
    p.add_argument("--samples", type=lambda s: int(s.replace("_", "")), default=100_000_000)
    p.add_argument("--shards", type=int, default=100_000)
    p.add_argument("--what", nargs="*", default=["work", "worker", "shuffle"],
                   choices=("work", "worker", "shuffle", "remix"))
    args = p.parse_args()
    bench = Bench("plan", args)
    for what in args.what:
        for side in args.libs:
            if not (side == "mosaicml" and what in ("worker", "remix")):
                bench.add({"what": what}, side, "plans", "plan",
                          {"lib": side, "what": what, "samples": int(args.samples * args.scale), "shards": args.shards})
    bench.run()
    if "base" in bench.codes:
        bench.report_ab(METRICS)
        return
    rows = []
    for config in bench.configs():
        digests = {r["side"]: r["result"]["digest"] for r in bench.records if r["config"] == config}
        for side in digests:
            rows.append([config["what"], side, *(fmt(bench.median(config, side, m), m.spec) for m in METRICS),
                         digests[side]])
        if len(digests) == 2:
            same = "identical" if len(set(digests.values())) == 1 else "DIFFERENT"
            rows.append([config["what"], "astream vs mosaicml", *(fmt(ratio(
                bench.median(config, "astream", m), bench.median(config, "mosaicml", m), False), ".2f") + "x"
                for m in METRICS), same])
    bench.table(f"{args.samples:,} samples in {args.shards:,} shards, world 8x8x8, py1e; medians of {args.runs}, "
                f"load {bench.loads()}", ["what", "side", *(m.name for m in METRICS), "ids digest"], rows)


if __name__ == "__main__":
    main()
