"""Worker -> consumer batch transport through the public ``Loader``, against the machine's
copy bandwidth.

A fresh process iterates ``Loader(StreamingDataset(local=...), num_workers=W)`` for
``--epochs`` epochs over ``--samples`` arrays of 100 KB (float32, uncompressed MDS, a warm
page cache, batch 32); the figure is MB/s of sample data over the later epochs, when the
persistent workers run already: a batch's way through a worker (its decode, the shared-
memory slots or the pipe, the consumer's hand-over), against ``num_workers=0`` (the same
decode in the consumer's process, no transport). The copy floor is measured in the driver:
``np.copyto`` of one batch's bytes, ``hot`` (the same source into the same destination: the
bytes stay in the CPU caches) and ``rotating`` (4 sources into 8 destinations, as the
transport's slots rotate: memory bandwidth).

    python benchmarks/transport_bench.py --runs 5
    python benchmarks/transport_bench.py --workers 1 --base main          # paired A/B
"""

from __future__ import annotations

import statistics
import time
from typing import Any

from _harness import Bench, Metric, data, fmt, parser

BATCH = 32
FLOATS = 25_600


def _later_mb_s(r: dict[str, Any]) -> float | None:
    later = r["result"]["epochs"][1:]
    if not later:
        return None
    return statistics.median(e["samples"] * FLOATS * 4 / e["total_s"] / 1e6 for e in later)


METRICS = [
    Metric("MB/s (later epochs)", _later_mb_s),
    Metric("CPU s", lambda r: r["proc"]["cpu_s"], higher=False, spec=".2f"),
    Metric("peak RSS MB", lambda r: r["proc"]["peak_rss_mb"], higher=False),
]


def copy_floor(rotating: bool) -> float:
    """MB/s of ``np.copyto`` of one batch, median of 400 copies."""
    import numpy as np

    sources = [np.full((BATCH, FLOATS), i, np.float32) for i in range(4 if rotating else 1)]
    targets = [np.empty_like(sources[0]) for _ in range(8 if rotating else 1)]
    times = []
    for i in range(400):
        t = time.perf_counter()
        np.copyto(targets[i % len(targets)], sources[i % len(sources)])
        times.append(time.perf_counter() - t)
    return sources[0].nbytes / statistics.median(times) / 1e6


def main() -> None:
    p = parser(__doc__, "transport", runs=5)
    p.add_argument("--workers", type=int, nargs="*", default=[0, 1, 2])
    p.add_argument("--samples", type=int, default=2_000)
    p.add_argument("--epochs", type=int, default=4)
    args = p.parse_args()
    bench = Bench("transport", args)
    folder = data.mds(bench.data, "arrays", "arrays", int(args.samples * args.scale))
    for workers in args.workers:
        bench.add({"workers": workers}, "astream", "mds", "stream",
                  {"lib": "astream", "remote": None, "local": str(folder), "workers": workers,
                   "epochs": args.epochs})
    bench.run()
    if "base" in bench.codes:
        bench.report_ab(METRICS)
        return
    hot, rotating = copy_floor(False), copy_floor(True)
    rows = []
    for config in bench.configs():
        mb = bench.median(config, "astream", METRICS[0])
        rows.append([config["workers"], fmt(mb), ", ".join(fmt(v) for v in bench.values(config, "astream", METRICS[0])),
                     fmt(mb / hot if mb else None, ".2f") + "x", fmt(mb / rotating if mb else None, ".2f") + "x"])
    bench.table(f"batch {BATCH} x 100 KB = {BATCH * FLOATS * 4 / 1e6:.1f} MB; copy floor: hot {hot:,.0f} MB/s, "
                f"rotating {rotating:,.0f} MB/s; load {bench.loads()}",
                ["workers", "MB/s (median)", "runs", "vs hot copy", "vs rotating copy"], rows)


if __name__ == "__main__":
    main()
