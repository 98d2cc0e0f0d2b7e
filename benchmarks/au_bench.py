"""Accelerator utilisation, MLPerf-Storage style: the most simulated accelerators a loader
keeps >= 90 % busy, astream against mosaicml-streaming + torch's ``DataLoader``.

N accelerators are N rank processes of one node, each a shuffled loader with ``--workers``
workers whose loop sleeps a fixed step time per batch; a trial passes when every one's
utilisation (compute over wall time, from when all have a first batch) is >= 90 %. For
each library, sample size and cache it finds the largest N: 1, 2, 4, ... until one fails,
then a bisection (up to ``--max-n``), and reports the lowest AU, the p99 ``next()`` wait, the
slowest first batch and the CPU per sample of the ranks' process trees at that N.

Datasets (uncompressed MDS, 64 MB shards): ``small``, 200,000 x ~1 KB records, batch 64,
16 ms a step; ``large``, 4,000 x 100 KB arrays, batch 16, 40 ms a step. Caches: ``cold``
(an empty cache per trial, the dataset behind the loopback server: astream over HTTP, the
peer over S3 at the same server) and ``warm`` (the dataset folder is the cache).

    python benchmarks/au_bench.py --peer-python mosaicml=PATH --max-n 16
    python benchmarks/au_bench.py --only large --large-steps 240 --libs astream
"""

from __future__ import annotations

from typing import Any

from _harness import Bench, Server, busy, data, fmt, largest, parser

SETS = {"small": ("records", 200_000, 64, 0.016, 100), "large": ("arrays", 4_000, 16, 0.04, 40)}


def main() -> None:
    p = parser(__doc__, "au", libs=("astream", "mosaicml"), runs=1)
    p.add_argument("--only", nargs="*", default=list(SETS), choices=list(SETS))
    p.add_argument("--caches", nargs="*", default=["cold", "warm"], choices=("cold", "warm"))
    p.add_argument("--max-n", type=int, default=32)
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--small-step", type=float, default=SETS["small"][3], help="seconds per step, ~1 KB samples")
    p.add_argument("--large-step", type=float, default=SETS["large"][3], help="seconds per step, ~100 KB samples")
    # More steps spread a loader's start (inside the measured window when its worker starts
    # after the first batch, as astream's does) over more samples in the CPU figure.
    p.add_argument("--small-steps", type=int, default=SETS["small"][4], help="measured steps per rank, ~1 KB")
    p.add_argument("--large-steps", type=int, default=SETS["large"][4], help="measured steps per rank, ~100 KB")
    args = p.parse_args()
    bench = Bench("au", args)
    rows = []
    with Server(bench.data, args.bandwidth) as server:
        for name in args.only:
            shape, count, batch, _, _ = SETS[name]
            folder = data.mds(bench.data, name, shape, int(count * args.scale))
            step_s, steps = (args.small_step, args.small_steps) if name == "small" else (args.large_step,
                                                                                         args.large_steps)
            for cache in args.caches:
                for side in (s for s in args.libs if bench.has(s)):
                    remote = None if cache == "warm" else server.url(folder) if side == "astream" else server.s3(folder)
                    params = {"lib": side, "remote": remote, "local": str(folder) if cache == "warm" else "{cache}",
                              "batch": batch, "workers": args.workers, "steps": steps, "step_s": step_s}
                    trials: dict[int, dict[str, Any]] = {}

                    def passes(n: int, side: str = side, params: dict[str, Any] = params,
                               trials: dict[int, dict[str, Any]] = trials, name: str = name,
                               cache: str = cache) -> bool:
                        trials[n] = busy(bench, {"dataset": name, "cache": cache}, side, n, params,
                                         server.s3_env() if side == "mosaicml" else None)
                        print(f"  {side} {name} {cache} N={n}: AU min {trials[n]['au_min']:.3f}", flush=True)
                        return bool(trials[n]["passed"])

                    n = largest(passes, args.max_n)
                    at = trials.get(n, {})
                    rows.append([name, cache, side, n, fmt(at.get("au_min"), ".3f"),
                                 fmt(at.get("p99_wait_ms"), ".1f"), fmt(at.get("first_batch_s"), ".2f"),
                                 fmt(at.get("cpu_us_per_sample"), ".0f"), at.get("steps", "-")])
    bench.table(f"largest N at AU >= 90 % (max {args.max_n}), {args.workers} worker(s) per accelerator, "
                f"load {bench.loads()}", ["dataset", "cache", "library", "largest N", "AU min", "p99 wait ms",
                                         "first batch s", "CPU µs/sample", "steps"], rows)


if __name__ == "__main__":
    main()
