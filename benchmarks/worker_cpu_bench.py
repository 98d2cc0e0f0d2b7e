"""Where a batch's CPU goes with and without worker processes: per thread and per process.

What it does:

1. Uses a set of ``peers_bench.py`` (``--dataset``: ``small``, 50,000 x ~1 KB of ``id:
   int``, ``name: str``, ``payload: bytes``; or ``large``, 1,000 x 100 KB; built there,
   under ``--data``), warm page cache.
2. For each code (this checkout, and ``--base DIR``: an extracted older ``astream``
   package, ``git archive <commit> astream | tar -x -C DIR``) and worker count
   (``--workers-list``), runs ``--runs`` fresh processes, the codes alternated; each
   iterates one ``Loader`` (batch 32) for ``--epochs`` epochs of ``--epoch-scale`` times
   the dataset, and measures the last epoch (persistent workers already running: the
   steady state, no start-up in it).
3. Reports, medians: wall µs per batch, and CPU µs per batch of the consumer's threads
   (its main thread, the event-loop thread ``astream-sync``, the pipe reader threads
   ``astream-reader-*`` together) and of the worker processes together, from
   ``/proc/<pid>/task/<tid>/stat`` (10 ms ticks; an epoch is ~1 s or more). The sum is
   the machine's CPU a batch costs: on 2 cores, wall >= that sum / 2. ``start``: the
   first epoch's wall time after its first batch minus the last epoch's (ms): what the
   workers' start (forkserver, processes, the stand-ins' hand-off) adds to a first epoch.

Usage::

    .venv/bin/python benchmarks/worker_cpu_bench.py --runs 3 --base /tmp/astream-base
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

from child_env import code_env

BENCH_DATA = Path(os.environ.get("ASTREAM_BENCH_DATA", Path(tempfile.gettempdir()) / "astream-bench"))
BATCH = 32
SIZES = {"small": 50_000, "large": 1_000}
_HZ = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


def _cpu(path: str) -> float:
    with open(path) as f:
        text = f.read()
    fields = text[text.rindex(")") + 2 :].split()
    return (int(fields[11]) + int(fields[12])) / _HZ


def _threads() -> dict[str, float]:
    names = {t.native_id: t.name for t in threading.enumerate()}
    out: dict[str, float] = {}
    for tid in os.listdir("/proc/self/task"):
        name = names.get(int(tid), "other")
        group = "reader" if name.startswith("astream-reader") else name if name in ("MainThread", "astream-sync") else "other"
        try:
            out[group] = out.get(group, 0.0) + _cpu(f"/proc/self/task/{tid}/stat")
        except OSError:
            continue
    return out


def _descendants() -> dict[int, float]:
    parents: dict[int, int] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    text = f.read()
                parents[int(entry)] = int(text[text.rindex(")") + 2 :].split()[1])
            except OSError:
                continue
    out: dict[int, float] = {}
    todo = [os.getpid()]
    while todo:
        pid = todo.pop()
        for child, parent in parents.items():
            if parent == pid:
                todo.append(child)
                try:
                    out[child] = _cpu(f"/proc/{child}/stat")
                except OSError:
                    continue
    return out


def child(root: Path, name: str, workers: int, shuffle: bool, epochs: int, scale: int) -> dict[str, float]:
    from astream import Loader, StreamingDataset

    size = SIZES[name]
    ds = StreamingDataset(local=str(root / name), batch_size=BATCH, shuffle=shuffle, epoch_size=size * scale)
    # Read 200 batches before the epoch's end: the reader threads end with the epoch, and
    # their ticks with them.
    near_end = size * scale - 200 * BATCH
    after_first: list[float] = []  # each epoch's wall time after its first batch
    with Loader(ds, num_workers=workers) as loader:
        for _ in range(epochs):
            threads0, kids0, began, n = _threads(), _descendants(), time.perf_counter(), 0
            threads1: dict[str, float] = {}
            kids1: dict[int, float] = {}
            first = 0.0
            for batch in loader:
                n += len(next(iter(batch.values())))
                if not first:
                    first = time.perf_counter()
                if not threads1 and n >= near_end:
                    threads1, kids1, at = _threads(), _descendants(), n
            wall = time.perf_counter() - began
            after_first.append(time.perf_counter() - first)
    batches = at / BATCH
    per = {k: (v - threads0.get(k, 0.0)) / batches * 1e6 for k, v in threads1.items()}
    consumer = sum(per.values())
    kids = sum(v - kids0.get(pid, 0.0) for pid, v in kids1.items()) / batches * 1e6
    return {"wall_us": wall / (n / BATCH) * 1e6, "main_us": per.get("MainThread", 0.0),
            "loop_us": per.get("astream-sync", 0.0), "readers_us": per.get("reader", 0.0),
            "consumer_us": consumer, "workers_us": kids, "total_us": consumer + kids,
            # What starting the workers (forkserver, processes, hand-off) adds to the first
            # epoch after its first batch: against the last epoch, whose workers run already.
            "start_ms": (after_first[0] - after_first[-1]) * 1e3}



def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default=str(BENCH_DATA / "peers"))
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--base", default=None)
    p.add_argument("--workers-list", type=int, nargs="*", default=[0, 2])
    p.add_argument("--dataset", default="small", choices=sorted(SIZES))
    p.add_argument("--shuffle", action="store_true")
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--epoch-scale", type=int, default=10)
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    p.add_argument("--workers", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args()
    root = Path(args.data)
    if args.child:
        if args.child == "base":
            sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in str(f)]
            sys.path.insert(0, args.base)
        print(json.dumps(child(root, args.dataset, args.workers, args.shuffle, args.epochs, args.epoch_scale)))
        return
    if not (root / args.dataset / "index.json").exists():
        p.error(f"no {args.dataset} set under {root}: run benchmarks/peers_bench.py --libs astream once to build it")
    for path in (root / args.dataset).iterdir():  # warm page cache
        path.read_bytes()
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # fresh processes import compiled bytecode, as installed
    env["PYTHONPYCACHEPREFIX"] = str(root / "pycache")
    codes = ["astream"] + (["base"] if args.base else [])
    results: dict[tuple[str, int], list[dict[str, float]]] = {}
    loads: list[float] = []
    for _ in range(args.runs):
        for workers in args.workers_list:
            for code in codes:
                cmd = [sys.executable, __file__, "--child", code, "--data", str(root), "--dataset", args.dataset,
                       "--workers", str(workers),
                       "--epochs", str(args.epochs), "--epoch-scale", str(args.epoch_scale)]
                cmd += ["--shuffle"] if args.shuffle else []
                cmd += ["--base", args.base] if code == "base" else []
                out = subprocess.run(cmd, capture_output=True, text=True, timeout=900, **code_env(env, code, args.base))
                if out.returncode:
                    print(f"{code} workers={workers} failed:\n{out.stderr[-2000:]}", file=sys.stderr)
                    continue
                results.setdefault((code, workers), []).append(json.loads(out.stdout.strip().splitlines()[-1]))
                loads.append(os.getloadavg()[0])
    keys = ["wall_us", "main_us", "loop_us", "readers_us", "consumer_us", "workers_us", "total_us", "start_ms"]
    print(f"load average {min(loads):.1f}-{max(loads):.1f}; {args.dataset}, shuffle={args.shuffle}; last of "
          f"{args.epochs} epochs of {args.epoch_scale} x the dataset; µs per batch of 32 (start: ms), median of {args.runs}")
    print("| code | workers | " + " | ".join(k.removesuffix("_us") for k in keys) + " |")
    print("|---|---:|" + "---:|" * len(keys))
    for (code, workers), rows in results.items():
        cells = " | ".join(f"{statistics.median(r[k] for r in rows):.0f}" for k in keys)
        print(f"| {code} | {workers} | {cells} |")


if __name__ == "__main__":
    main()
