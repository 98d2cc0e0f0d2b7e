"""Accelerator utilisation, MLPerf-Storage style (issue #20). Results: docs/bench/au.md.

N simulated accelerators: N rank processes of one node, each a loader (astream ``Loader``,
or mosaicml-streaming 0.13 with torch's ``DataLoader``) feeding a loop that sleeps a fixed
step time per batch (``benchmarks/au_rank.py``). An accelerator's utilisation (AU) is its
compute time over its wall time, from its first batch to its last (the first batch's
latency is reported apart). For each library, sample size (~1 KB, ~100 KB) and cache
(``cold``: an empty cache, the dataset behind a loopback HTTP server, S3-style for the
peer; ``warm``: the dataset folder is the cache), it finds the largest N whose every
accelerator keeps AU >= 90%: N = 1, 2, 4, ... until one fails, then a bisection. The
ranks start their measured steps together, once every one has its first batch. It also
reports the p99 ``next()`` wait and the CPU seconds per sample at that N (each rank's
process tree from its first batch to its last: loader workers and a node agent started
there included; the loopback server, in this driver, is not), and the resume latency (state dict at 90% of an epoch, a fresh loader, the first
batch; one rank, warm).

Usage::

    python benchmarks/au_bench.py [--peer-python PEER_PYTHON] [--max-n 32] [--workers 1]
                                  [--only small,large] [--caches cold,warm] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np

from astream import MDSWriter
from astream.testing import LoopbackServer

RANK = Path(__file__).with_name("au_rank.py")
PEER_PYTHON = os.environ.get("ASTREAM_PEER_PYTHON", "")
# name: (samples, batch, step seconds, steps)
SIZES = {"small": (200_000, 64, 0.016, 100), "large": (4_000, 16, 0.04, 40)}


def build(root: Path, names: list[str]) -> None:
    if "small" in names and not (root / "small" / "index.json").exists():
        with MDSWriter(out=str(root / "small"), columns={"id": "int64", "payload": "bytes"}, size_limit="64mb") as w:
            for i in range(SIZES["small"][0]):
                w.write({"id": i, "payload": os.urandom(1000)})
    if "large" in names and not (root / "large" / "index.json").exists():
        rng = np.random.default_rng(0)
        with MDSWriter(out=str(root / "large"), columns={"id": "int64", "x": "ndarray:uint8:102400"},
                       size_limit="64mb") as w:
            for i in range(SIZES["large"][0]):
                w.write({"id": i, "x": rng.integers(0, 255, 102400, np.uint8)})


def trial(lib: str, name: str, cache: str, n: int, data: Path, port: int, scratch: Path, args: argparse.Namespace,
          resume: bool = False) -> list[dict[str, Any]]:
    _samples, batch, step, steps = SIZES[name]
    step = args.small_step if name == "small" else args.large_step
    steps = args.small_steps if name == "small" else args.large_steps
    run = scratch / f"{lib}-{name}-{cache}-{n}-{time.monotonic_ns()}"
    run.mkdir(parents=True)
    if cache == "warm":
        remote, local = None, str(data / name)
    elif lib == "astream":
        remote, local = f"http://127.0.0.1:{port}/bucket/{name}", str(run / "cache")
    else:
        remote, local = f"s3://bucket/{name}", str(run / "cache")
    python = sys.executable if lib == "astream" else args.peer_python
    procs, outs = [], []
    master = 20000 + (os.getpid() + n + len(name)) % 20000
    for rank in range(n):
        out = run / f"rank{rank}.json"
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": str(n), "LOCAL_RANK": str(rank),
               "LOCAL_WORLD_SIZE": str(n), "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(master),
               "ASTREAM_RUN_ID": run.name, "S3_ENDPOINT_URL": f"http://127.0.0.1:{port}",
               "AWS_ACCESS_KEY_ID": "x", "AWS_SECRET_ACCESS_KEY": "x", "TMPDIR": str(run)}
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = str(scratch / f"pycache-{lib}")
        cmd = [python, str(RANK), "--lib", lib, "--local", local, "--batch", str(batch), "--workers",
               str(args.workers), "--steps", str(steps), "--step-time", str(step), "--out", str(out)]
        if remote is not None:
            cmd += ["--remote", remote]
        if resume:
            cmd.append("--resume")
        else:
            cmd += ["--barrier", str(run)]
        procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True))
        outs.append(out)
    results = []
    for proc, out in zip(procs, outs, strict=True):
        _, err = proc.communicate(timeout=900)
        if proc.returncode != 0 or not out.exists():
            raise RuntimeError(f"{lib} rank failed ({proc.returncode}): {err[-2000:]}")
        results.append(json.loads(out.read_text()))
    shutil.rmtree(run, ignore_errors=True)
    return results


def figures(results: list[dict[str, Any]]) -> dict[str, Any]:
    aus = [r["compute_s"] / r["wall_s"] for r in results]
    waits = np.concatenate([np.asarray(r["waits"], float) for r in results])
    samples = sum(r["samples"] for r in results)
    cpu_s = sum(r["cpu_s"] for r in results)
    return {"n": len(results), "au_min": min(aus), "au_mean": float(np.mean(aus)),
            "p99_wait_ms": float(np.percentile(waits, 99) * 1e3) if waits.size else 0.0,
            "first_batch_s": max(r["first_batch_s"] for r in results), "cpu_per_sample_us": cpu_s / samples * 1e6,
            "steps": results[0]["steps"]}


def measured(lib: str, name: str, cache: str, n: int, *rest: Any) -> dict[str, Any]:
    row = figures(trial(lib, name, cache, n, *rest))
    print(f"  {lib:7s} {name:5s} {cache:4s} N={n:3d}: AU min {row['au_min']:.3f} mean {row['au_mean']:.3f}, "
          f"p99 wait {row['p99_wait_ms']:.1f} ms, first batch {row['first_batch_s']:.2f} s, "
          f"CPU {row['cpu_per_sample_us']:.1f} us/sample ({row['steps']} steps)", flush=True)
    return row


def largest_n(lib: str, name: str, cache: str, *rest: Any, max_n: int) -> tuple[int, dict[str, Any] | None]:
    """The largest N at AU >= 0.9 for every accelerator (doubling, then bisection)."""
    best: tuple[int, dict[str, Any] | None] = (0, None)
    n, fail = 1, None
    while n <= max_n:
        row = measured(lib, name, cache, n, *rest)
        if row["au_min"] < 0.9:
            fail = n
            break
        best = (n, row)
        n *= 2
    lo, hi = best[0], fail if fail is not None else best[0]
    while fail is not None and hi - lo > 1:
        mid = (lo + hi) // 2
        row = measured(lib, name, cache, mid, *rest)
        if row["au_min"] >= 0.9:
            lo, best = mid, (mid, row)
        else:
            hi = mid
    return best


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--peer-python", default=PEER_PYTHON)
    p.add_argument("--max-n", type=int, default=32)
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--small-step", type=float, default=SIZES["small"][2], help="seconds per step, ~1 KB samples")
    p.add_argument("--large-step", type=float, default=SIZES["large"][2], help="seconds per step, ~100 KB samples")
    # More steps spread a loader's start (inside the measured window when its worker starts
    # after the first batch, as astream's does) over more samples in the CPU figure.
    p.add_argument("--small-steps", type=int, default=SIZES["small"][3], help="measured steps per rank, ~1 KB")
    p.add_argument("--large-steps", type=int, default=SIZES["large"][3], help="measured steps per rank, ~100 KB")
    p.add_argument("--only", default="small,large")
    p.add_argument("--caches", default="cold,warm")
    p.add_argument("--libs", default="astream,mosaic")
    p.add_argument("--data", default=os.path.join(os.environ.get("ASTREAM_BENCH_DATA", tempfile.gettempdir()),
                                                  "astream-bench", "au"))
    p.add_argument("--json", default=None)
    args = p.parse_args()
    libs = args.libs.split(",")
    if "mosaic" in libs and not args.peer_python:
        p.error("the peer needs --peer-python (or ASTREAM_PEER_PYTHON); see docs/bench/peer.md")
    data = Path(args.data) / "bucket"
    data.mkdir(parents=True, exist_ok=True)
    build(data, args.only.split(","))
    rows = []
    with tempfile.TemporaryDirectory() as scratch, LoopbackServer(str(data.parent)) as server:
        print(f"load: {os.getloadavg()}", flush=True)
        for name in args.only.split(","):
            for cache in args.caches.split(","):
                for lib in libs:
                    n, row = largest_n(lib, name, cache, data, server.port, Path(scratch), args, max_n=args.max_n)
                    rows.append({"lib": lib, "size": name, "cache": cache, "largest_n": n, "at_n": row,
                                 "load": os.getloadavg()})
                    print(f"{lib} {name} {cache}: largest N at AU >= 90%: {n}", flush=True)
            for lib in libs:
                res = trial(lib, name, "warm", 1, data, server.port, Path(scratch), args, resume=True)[0]
                rows.append({"lib": lib, "size": name, "resume_s": res["resume_s"], "load": os.getloadavg()})
                print(f"{lib} {name}: resume at batch {res['at_batch']} of {res['of']}: first batch after "
                      f"{res['resume_s'] * 1e3:.0f} ms", flush=True)
    print(f"load: {os.getloadavg()}")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
