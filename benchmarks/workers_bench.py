"""Worker processes benchmark: per-epoch start cost, batch transport, shuffled small samples.

What it does:

1. Builds (once) under ``--data`` (default $ASTREAM_BENCH_DATA/workers or
   <tmp>/astream-bench/workers) three uncompressed MDS datasets with astream's writer:
   ``large`` (1,000 x 100 KB, ``x: ndarray:float32:25600``, default 64 MB shards),
   ``small`` (50,000 x ~1 KB: ``id: int64``, ``x: ndarray:uint8:1016``, 8 MB shards: a
   shuffled batch spans several shards, as with 64 MB shards and a larger dataset) and
   ``smallvar`` (50,000 x ~1 KB of ``int``, ``str``, ``bytes``, 8 MB shards).
2. Runs every configuration ``--runs`` times, each in a fresh process, the variants
   interleaved: for each, one ``Loader`` iterated ``--epochs`` epochs (batch 32, warm
   page cache); reports samples/s of the first epoch (from the dataset's construction:
   the forkserver and the workers' start included, and the import of astream, which the
   run's clock starts before) and the median of the later ones.
   Variants: ``workers=0``, ``workers=2`` (persistent, the default) and ``workers=2
   persistent=False``; with ``--base DIR`` (an extracted older ``astream`` package, e.g.
   ``git archive <commit> astream | tar -x -C DIR``) the same configurations of that code.
3. The copy floor: ``np.copyto`` of a batch's bytes (32 x 100 KB) into a fresh array,
   MB/s, median of 200, in the driver.

Prints medians and the 1-minute load average around each configuration (the machine is
shared), the later epochs also in samples per CPU-second of the process (fairer than the
wall clock on a loaded machine), and shuffled / unshuffled for each code. ``--no-workers``
runs only ``workers=0`` (the shuffled small-sample comparison).

Usage::

    .venv/bin/python benchmarks/workers_bench.py --runs 3 --base /tmp/astream-base
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

BENCH_DATA = Path(os.environ.get("ASTREAM_BENCH_DATA", Path(tempfile.gettempdir()) / "astream-bench"))
BATCH = 32
SAMPLE_BYTES = {"large": 102400, "small": 1024, "smallvar": 950}


def build(root: Path) -> None:
    import numpy as np

    from astream import MDSWriter

    specs: dict[str, tuple[dict[str, str], Any, int, Any]] = {
        "large": ({"x": "ndarray:float32:25600"}, lambda i: {"x": np.full(25600, i, np.float32)}, 1000, None),
        "small": ({"id": "int64", "x": "ndarray:uint8:1016"},
                  lambda i: {"id": i, "x": np.full(1016, i % 251, np.uint8)}, 50000, "8mb"),
        "smallvar": ({"id": "int", "name": "str", "payload": "bytes"},
                     lambda i: {"id": i, "name": f"name-{i}-abcdefghij", "payload": bytes(900)}, 50000, "8mb"),
    }
    for name, (columns, make, n, limit) in specs.items():
        out = root / name
        if (out / "index.json").exists():
            continue
        kwargs = {"size_limit": limit} if limit else {}
        with MDSWriter(out=str(out), columns=columns, **kwargs) as writer:
            for i in range(n):
                writer.write(make(i))


def child(args: argparse.Namespace) -> None:
    """One run: a Loader over ``--dataset`` for ``--epochs`` epochs; prints JSON."""
    if args.base:
        # An older astream: ahead of this checkout's editable install.
        sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in str(f)]
        sys.path.insert(0, args.base)
    t0 = time.perf_counter()
    from astream import Loader, StreamingDataset

    ds = StreamingDataset(local=str(Path(args.data) / args.dataset), batch_size=BATCH, shuffle=args.shuffle)
    extra = {} if args.persistent is None else {"persistent_workers": args.persistent}
    loader = Loader(ds, num_workers=args.workers, **extra)
    rates, cpu_rates = [], []
    start, cpu = t0, time.process_time()
    for _ in range(args.epochs):
        n = sum(len(next(iter(b.values()))) for b in loader)
        end, cpu_end = time.perf_counter(), time.process_time()
        rates.append(n / (end - start))
        cpu_rates.append(n / max(cpu_end - cpu, 1e-9))  # this process's CPU (workers' not counted)
        start, cpu = end, cpu_end
    loader.close()
    ds.close()
    print(json.dumps({"rates": rates, "cpu_rates": cpu_rates}))


def copy_floor() -> float:
    import numpy as np

    src = np.ones((BATCH, 25600), np.float32)
    times = []
    for _ in range(200):
        t = time.perf_counter()
        dst = np.empty_like(src)
        np.copyto(dst, src)
        times.append(time.perf_counter() - t)
    return src.nbytes / statistics.median(times) / 1e6


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--data", default=str(BENCH_DATA / "workers"))
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--base", default=None, help="an extracted older astream package to compare with")
    p.add_argument("--only", nargs="*", default=None, help="datasets to run")
    p.add_argument("--no-workers", action="store_true", help="only num_workers=0 (shuffled against unshuffled)")
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--dataset", default="large", help=argparse.SUPPRESS)
    p.add_argument("--workers", type=int, default=0, help=argparse.SUPPRESS)
    p.add_argument("--shuffle", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--persistent", type=lambda v: v == "1", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        child(args)
        return
    build(Path(args.data))
    codes = [("new", None)] + ([("base", args.base)] if args.base else [])
    configs = []
    for dataset in args.only or ("large", "small", "smallvar"):
        for shuffle in (False, True):
            for workers, persistent in ((0, None),) if args.no_workers else ((0, None), (2, None), (2, False)):
                for code, base in codes:
                    if code == "base" and persistent is not None:
                        continue  # the older code has no such parameter (it restarts workers)
                    configs.append((dataset, shuffle, workers, persistent, code, base))
    results: dict[tuple[Any, ...], list[dict[str, list[float]]]] = {c[:5]: [] for c in configs}
    loads: dict[tuple[Any, ...], list[float]] = {c[:5]: [] for c in configs}
    for _ in range(args.runs):
        for dataset, shuffle, workers, persistent, code, base in configs:
            cmd = [sys.executable, __file__, "--child", "--data", args.data, "--dataset", dataset,
                   "--workers", str(workers), "--epochs", str(args.epochs)]
            cmd += ["--shuffle"] if shuffle else []
            cmd += [] if persistent is None else ["--persistent", "1" if persistent else "0"]
            cmd += ["--base", base] if base else []
            out = subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=600).stdout
            key = (dataset, shuffle, workers, persistent, code)
            results[key].append(json.loads(out.strip().splitlines()[-1]))
            loads[key].append(os.getloadavg()[0])
    print(f"copy floor (np.copyto of {BATCH} x 100 KB): {copy_floor():,.0f} MB/s")
    print("| dataset | shuffle | workers | code | epoch 1 samples/s | later epochs samples/s | later MB/s "
          "| later samples/CPU-s | load |")
    print("|---|---|---|---|---:|---:|---:|---:|---:|")
    later: dict[tuple[Any, ...], tuple[float, float]] = {}
    for key, runs in results.items():
        dataset, shuffle, workers, persistent, code = key
        first = statistics.median(r["rates"][0] for r in runs)
        wall, cpu = (statistics.median(x for r in runs for x in r[name][1:]) if args.epochs > 1 else float("nan")
                     for name in ("rates", "cpu_rates"))
        later[key] = wall, cpu
        label = f"{workers}" + ("" if persistent is None else " (persistent=False)")
        mbs = wall * SAMPLE_BYTES[dataset] / 1e6
        print(f"| {dataset} | {'yes' if shuffle else 'no'} | {label} | {code} | {first:,.0f} | {wall:,.0f} | "
              f"{mbs:,.0f} | {cpu:,.0f} | {statistics.median(loads[key]):.1f} |")
    print("\nshuffled / unshuffled, later epochs (wall, CPU):")
    for (dataset, shuffle, workers, persistent, code), (wall, cpu) in later.items():
        plain = later.get((dataset, False, workers, persistent, code))
        if shuffle and plain:
            print(f"- {dataset}, {workers} workers, {code}: {wall / plain[0]:.2f} (wall), {cpu / plain[1]:.2f} (CPU)")


if __name__ == "__main__":
    main()
