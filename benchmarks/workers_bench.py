"""Worker processes: what they cost and bring, per epoch, against reading in the consumer.

A fresh process iterates ``Loader(StreamingDataset(local=...), num_workers=W)`` (persistent
workers, the default) for ``--epochs`` epochs of ``--epoch-scale`` times the dataset over a
warm page cache, batch 32. Figures, medians over rounds:

- epoch 1 samples/s, from the dataset's construction (the forkserver's and the workers'
  start in it) and the later epochs' (the workers run already);
- the CPU of the whole process tree (consumer, forkserver, workers, node agent) per batch in
  the later epochs, in µs: on 2 cores a batch's wall time is at least half of it;
- the start: the first epoch's time after its first batch less the later epochs' (what
  starting the workers adds to a first epoch), in ms.

Datasets: ``large``, 1,000 x 100 KB arrays (64 MB shards); ``small``, 50,000 x ~1 KB records
with ``str``/``bytes`` columns (8 MB shards: a shuffled batch spans several shards).

    python benchmarks/workers_bench.py --runs 3
    python benchmarks/workers_bench.py --only small --epoch-scale 20 --base main     # paired A/B
"""

from __future__ import annotations

import itertools
import statistics
from typing import Any

from _harness import Bench, Metric, data, fmt, parser, ratio

SETS = {"large": ("arrays", 1_000, "64mb"), "small": ("records", 50_000, "8mb")}


def _later(r: dict[str, Any]) -> list[dict[str, Any]]:
    return list(r["result"]["epochs"][1:])


def _start_ms(r: dict[str, Any]) -> float | None:
    first, later = r["result"]["epochs"][0], _later(r)
    if not later:
        return None
    return ((first["total_s"] - first["first_s"]) - statistics.median(e["total_s"] - e["first_s"] for e in later)) * 1e3


METRICS = [
    Metric("epoch 1 samples/s", lambda r: r["result"]["epochs"][0]["samples"] / r["result"]["epochs"][0]["total_s"]),
    Metric("later samples/s", lambda r: statistics.median(e["samples"] / e["total_s"] for e in _later(r))
           if _later(r) else None),
    Metric("CPU µs per batch (tree, later)", lambda r: statistics.median(e["cpu_s"] / e["samples"] * 32e6
                                                                         for e in _later(r)) if _later(r) else None,
           higher=False),
    Metric("start ms", _start_ms, higher=False),
]


def main() -> None:
    p = parser(__doc__, "workers")
    p.add_argument("--only", nargs="*", default=list(SETS), choices=list(SETS))
    p.add_argument("--workers", type=int, nargs="*", default=[0, 2])
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--epoch-scale", type=int, default=1, help="epochs of K times the dataset (epoch_size)")
    args = p.parse_args()
    bench = Bench("workers", args)
    for name, shuffle, workers in itertools.product(args.only, (False, True), args.workers):
        shape, count, limit = SETS[name]
        folder = data.mds(bench.data, name, shape, int(count * args.scale), limit)
        size = data.count(folder)
        bench.add({"dataset": name, "shuffle": shuffle, "workers": workers}, "astream", "mds", "stream",
                  {"lib": "astream", "remote": None, "local": str(folder), "workers": workers, "shuffle": shuffle,
                   "epochs": args.epochs, "epoch_size": size * args.epoch_scale if args.epoch_scale > 1 else None})
    bench.run()
    if "base" in bench.codes:
        bench.report_ab(METRICS)
        return
    rows = []
    for config in bench.configs():
        got = [bench.median(config, "astream", m) for m in METRICS]
        zero = bench.median({**config, "workers": 0}, "astream", METRICS[1])
        rows.append([*config.values(), *(fmt(v) for v in got), fmt(ratio(got[1], zero), ".2f") + "x"])
    bench.table(f"medians of {args.runs} fresh processes, {args.epochs} epochs of {args.epoch_scale} x the dataset, "
                f"load {bench.loads()}", ["dataset", "shuffle", "workers", *(m.name for m in METRICS),
                                          "later / 0 workers"], rows)


if __name__ == "__main__":
    main()
