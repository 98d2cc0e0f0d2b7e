"""Iteration benchmark: astream StreamingDataset/Loader vs mosaicml-streaming, same data.

What it does:

1. Builds (once) two uncompressed MDS datasets with astream's writer (default 64 MB shards,
   byte-identical to the peer's) under ``--data`` (default $ASTREAM_BENCH_DATA/loader or <tmp>/astream-bench/loader, not the
   repo), laid out as ``<data>/root/bucket/<name>`` so the same files serve a local
   remote, HTTP and path-style S3:

   - ``small``: 200,000 samples of ~1 KB (``id: int``, ``name: str`` ~20 chars,
     ``payload: bytes`` 900), the "many small records" case;
   - ``large``: 2,000 samples of 100 KB (``x: ndarray:float32:25600``).

2. Serves ``<data>/root`` with :class:`astream.testing.LoopbackServer` in its own process.
3. Runs every configuration ``--runs`` times, each in a fresh process, interleaved:

   - library: ``astream`` (this interpreter) or ``mosaic`` (mosaicml-streaming 0.13 in
     ``--peer-python``);
   - how: ``loader`` (astream ``Loader`` / torch ``DataLoader`` over the peer's
     ``StreamingDataset``, batch size 32, ``--workers`` workers, default collation) or
     ``iter`` (``for sample in ds``);
   - cache: ``warm`` (the dataset directory is the local cache, no remote), ``local``
     (cold: an empty cache, the dataset directory as remote), ``http`` (cold: an empty
     cache, astream from ``http://127.0.0.1:PORT/bucket/<name>``, the peer from
     ``s3://bucket/<name>`` with ``S3_ENDPOINT_URL`` at the same server).

   Each run iterates ``--epochs`` epochs (default 3) in one process and measures
   samples/s over the first epoch (from the dataset's construction: worker start and, for
   the cold caches, the downloads included) and the median over the later epochs (warm
   cache; workers start again each epoch, as in training), the time to the first batch (or
   sample) from the dataset's construction (imports excluded; they are reported apart),
   and the peak of the RSS summed over the run's process tree (main process, loader
   workers, forkserver, node agent), polled from ``/proc`` every 20 ms by the driver.

4. Prints medians, the ratios astream / mosaic, the targets of issue 6 and the load
   average around each configuration (the machine is shared).

Usage::

    .venv/bin/python benchmarks/loader_bench.py --runs 3
    .venv/bin/python benchmarks/loader_bench.py --runs 1 --only small --libs astream --caches warm
"""

from __future__ import annotations

import argparse
import itertools
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from peer_stub import stub_streaming_vision

# The peer's interpreter (a venv with mosaicml-streaming, see docs/bench/peer.md) and the
# folder for generated data: from the environment, else this interpreter and the temp dir.
PEER_PYTHON = os.environ.get("ASTREAM_PEER_PYTHON", sys.executable)
BENCH_DATA = Path(os.environ.get("ASTREAM_BENCH_DATA", Path(tempfile.gettempdir()) / "astream-bench"))
BATCH = 32
DATASETS = ("small", "large")
CACHES = ("warm", "local", "http")
HOWS = ("loader", "iter")  # "loader" runs once per --workers value
LIBS = ("astream", "mosaic")


# -- datasets ----------------------------------------------------------------------------------
def build_datasets(root: Path) -> None:
    import numpy as np

    from astream import MDSWriter

    words = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta"]
    for name in DATASETS:
        out = root / "bucket" / name
        marker = out / ".built-v1"
        if marker.exists():
            continue
        shutil.rmtree(out, ignore_errors=True)
        out.parent.mkdir(parents=True, exist_ok=True)
        rng = np.random.default_rng(7)
        print(f"building {out} ...", file=sys.stderr, flush=True)
        if name == "small":
            with MDSWriter(out=str(out), columns={"id": "int", "name": "str", "payload": "bytes"}) as w:
                for i in range(200_000):
                    w.write({"id": i, "name": " ".join(words[(i + k) % 6] for k in range(3)),
                             "payload": rng.bytes(900)})
        else:
            with MDSWriter(out=str(out), columns={"x": "ndarray:float32:25600"}) as w:
                for _ in range(2_000):
                    w.write({"x": rng.standard_normal(25_600).astype(np.float32)})
        marker.touch()


def dataset_bytes(root: Path, name: str) -> int:
    return sum(p.stat().st_size for p in (root / "bucket" / name).glob("shard.*"))


# -- one run (in a fresh process; prints one JSON line) ------------------------------------------
def _length(batch: Any) -> int:
    if isinstance(batch, dict):
        return _length(next(iter(batch.values())))
    if hasattr(batch, "shape"):
        return int(batch.shape[0])
    return len(batch)


def _iterate(items: Any, count: Any) -> tuple[float | None, int]:
    start = time.perf_counter()
    first = None
    n = 0
    for item in items:
        if first is None:
            first = time.perf_counter() - start
        n += count(item)
    return first, n


def _epochs(items: Any, count: Any, epochs: int, start: float, setup: float) -> dict[str, Any]:
    """Iterate ``epochs`` epochs; the first epoch's times count from the dataset's construction."""
    first, n = _iterate(items, count)
    total = time.perf_counter() - start
    later = []
    for _ in range(epochs - 1):
        t = time.perf_counter()
        _, m = _iterate(items, count)
        later.append(m / (time.perf_counter() - t))
    return {"first_s": setup + (first or 0.0), "total_s": total, "samples": n,
            "later_rate": statistics.median(later) if later else None}


def worker_astream(how: str, remote: str | None, local: str, workers: int, epochs: int) -> dict[str, Any]:
    t0 = time.perf_counter()
    from astream import Loader, StreamingDataset

    import_s = time.perf_counter() - t0
    start = time.perf_counter()
    ds = StreamingDataset(remote=remote, local=local, batch_size=BATCH)
    items: Any = Loader(ds, batch_size=BATCH, num_workers=workers) if how == "loader" else ds
    setup = time.perf_counter() - start
    result = _epochs(items, _length if how == "loader" else lambda s: 1, epochs, start, setup)
    ds.close()
    return {"import_s": import_s, **result}


def worker_mosaic(how: str, remote: str | None, local: str, workers: int, epochs: int) -> dict[str, Any]:
    import warnings

    warnings.simplefilter("ignore")
    stub_streaming_vision()
    t0 = time.perf_counter()
    from streaming import StreamingDataset
    from torch.utils.data import DataLoader

    import_s = time.perf_counter() - t0
    start = time.perf_counter()
    ds = StreamingDataset(remote=remote, local=local, batch_size=BATCH, shuffle=False)
    items: Any = DataLoader(ds, batch_size=BATCH, num_workers=workers) if how == "loader" else ds
    setup = time.perf_counter() - start
    result = _epochs(items, _length if how == "loader" else lambda s: 1, epochs, start, setup)
    return {"import_s": import_s, **result}


# -- the driver --------------------------------------------------------------------------------
def _tree_rss(pid: int) -> int:
    """RSS in bytes summed over ``pid`` and all its descendants (0 once it is gone)."""
    total = 0
    todo = [pid]
    while todo:
        p = todo.pop()
        try:
            with open(f"/proc/{p}/statm") as fh:
                total += int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")
            for task in os.listdir(f"/proc/{p}/task"):
                with open(f"/proc/{p}/task/{task}/children") as fh:
                    todo.extend(int(c) for c in fh.read().split())
        except (OSError, ValueError):
            continue
    return total


def measured_child(cmd: list[str], env: dict[str, str], what: str) -> dict[str, Any]:
    """Run one measured child: its last stdout line (JSON), plus the peak RSS of its process
    tree (``rss_mb``, polled every 20 ms) and the machine's mean load over the run."""
    load_before = os.getloadavg()[0]
    proc = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    peak = 0
    stop = threading.Event()

    def poll() -> None:
        nonlocal peak
        while not stop.is_set():
            peak = max(peak, _tree_rss(proc.pid))
            stop.wait(0.02)

    poller = threading.Thread(target=poll, daemon=True)
    poller.start()
    try:
        out, err = proc.communicate(timeout=1800)
    finally:
        stop.set()
        poller.join()
    if proc.returncode != 0:
        raise SystemExit(f"{what} failed (exit {proc.returncode}):\n{err[-4000:]}")
    result = dict(json.loads(out.strip().splitlines()[-1]))
    result["rss_mb"] = peak / 1e6
    result["load"] = (load_before + os.getloadavg()[0]) / 2
    return result


def child_env(data: Path) -> dict[str, str]:
    """The environment of a run: bytecode cached (outside the repo), as an installed package has it.

    This machine sets PYTHONDONTWRITEBYTECODE=1, which would make every fresh process (and
    every spawned loader worker) compile astream from source.
    """
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)
    env["PYTHONPYCACHEPREFIX"] = str(data / "pycache")
    return env


def warm_up(data: Path, libs: list[str], peer_python: str) -> None:
    """Import each side once so that its bytecode is cached before anything is timed."""
    code = {"astream": (sys.executable, "import astream, astream._dataset.loader, astream.testing"),
            "mosaic": (peer_python, "import sys, types; m = types.ModuleType('streaming.vision'); m.__path__ = []; "
                                    "sys.modules['streaming.vision'] = m; import streaming, torch.utils.data")}
    for lib in libs:
        python, source = code[lib]
        subprocess.run([python, "-W", "ignore", "-c", source], env=child_env(data), check=True)


def run_one(lib: str, how: str, cache: str, name: str, workers: int, root: Path, port: int,
            scratch: Path, peer_python: str, epochs: int) -> dict[str, Any]:
    data_dir = root / "bucket" / name
    local = str(data_dir) if cache == "warm" else tempfile.mkdtemp(prefix=f"{lib}-{cache}-", dir=str(scratch))
    env = child_env(root.parent)
    env["TMPDIR"] = tempfile.mkdtemp(prefix="tmp-", dir=str(scratch))
    python = peer_python if lib == "mosaic" else sys.executable
    remote: str
    if cache == "warm":
        remote = "-"
    elif cache == "local":
        remote = str(data_dir)
    elif lib == "astream":
        remote = f"http://127.0.0.1:{port}/bucket/{name}"
    else:
        remote = f"s3://bucket/{name}"
        env.update(S3_ENDPOINT_URL=f"http://127.0.0.1:{port}", AWS_ACCESS_KEY_ID="x",
                   AWS_SECRET_ACCESS_KEY="x", AWS_DEFAULT_REGION="us-east-1")
    try:
        result = measured_child([python, __file__, "--worker", lib, how, remote, local, str(workers), str(epochs)],
                                env, f"{lib} {how} {cache} {name}")
    finally:
        if cache != "warm":
            shutil.rmtree(local, ignore_errors=True)
        shutil.rmtree(env["TMPDIR"], ignore_errors=True)
    return result


def _fmt_ratio(value: float, target: float, higher: bool) -> str:
    ok = value >= target if higher else value <= target
    return f"{value:.2f}x ({'>=' if higher else '<='} {target:g}x: {'met' if ok else 'NOT met'})"


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--workers", type=int, nargs="*", default=[0, 2],
                        help="loader worker counts, both libraries (default 0 and 2)")
    parser.add_argument("--data", default=str(BENCH_DATA / "loader"))
    parser.add_argument("--only", nargs="*", default=list(DATASETS), choices=DATASETS)
    parser.add_argument("--caches", nargs="*", default=list(CACHES), choices=CACHES)
    parser.add_argument("--hows", nargs="*", default=list(HOWS), choices=HOWS)
    parser.add_argument("--libs", nargs="*", default=list(LIBS), choices=LIBS)
    parser.add_argument("--peer-python", default=PEER_PYTHON)
    parser.add_argument("--json", help="also write the raw results here")
    parser.add_argument("--epochs", type=int, default=3,
                        help="epochs per run: the first (from construction, cold where the cache is) "
                             "and the median rate of the others")
    parser.add_argument("--worker", nargs=6, metavar=("LIB", "HOW", "REMOTE", "LOCAL", "WORKERS", "EPOCHS"))
    args = parser.parse_args()
    if args.worker:
        lib, how, remote, local, workers, epochs = args.worker
        args_ = (how.rstrip("0123456789"), None if remote == "-" else remote, local, int(workers), int(epochs))
        if lib == "mosaic":
            print(json.dumps(worker_mosaic(*args_)))
        else:
            print(json.dumps(worker_astream(*args_)))
        return

    data = Path(args.data)
    root = data / "root"
    build_datasets(root)
    scratch = data / "scratch"
    scratch.mkdir(parents=True, exist_ok=True)
    warm_up(data, sorted({lib.rstrip("+") for lib in args.libs} | {"astream"}), args.peer_python)
    server = subprocess.Popen(
        [sys.executable, "-c", "import sys; from astream.testing import LoopbackServer; "
         "s = LoopbackServer(sys.argv[1]).start(); print(s.port, flush=True); sys.stdin.read()", str(root)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=child_env(data),
    )
    assert server.stdout is not None
    port = int(server.stdout.readline())
    hows = [h for how in args.hows for h in ([f"loader{w}" for w in args.workers] if how == "loader" else [how])]
    configs = list(itertools.product(args.only, args.caches, hows, args.libs))
    results: dict[tuple[str, str, str, str], list[dict[str, Any]]] = {c: [] for c in configs}
    try:
        for r in range(args.runs):
            for name, cache, how, lib in configs:
                workers = int(how[len("loader"):]) if how.startswith("loader") else 0
                res = run_one(lib, how, cache, name, workers, root, port, scratch, args.peer_python, args.epochs)
                results[(name, cache, how, lib)].append(res)
                print(f"run {r + 1} {name:5s} {cache:5s} {how:6s} {lib:7s} {res['samples'] / res['total_s']:>10,.0f}/s "
                      f"first {res['first_s']:.3f} s  rss {res['rss_mb']:.0f} MB  load {res['load']:.1f}",
                      file=sys.stderr, flush=True)
    finally:
        server.stdin.close()  # type: ignore[union-attr]
        server.wait(10)
    if args.json:
        Path(args.json).write_text(json.dumps({"|".join(k): v for k, v in results.items()}, indent=1))
    report(results, root, args)


def report(results: dict[tuple[str, str, str, str], list[dict[str, Any]]], root: Path, args: Any) -> None:
    import numpy as np

    med: dict[tuple[str, str, str, str], dict[str, float]] = {}
    for key, rs in results.items():
        if rs:
            med[key] = {f: statistics.median(r[f] for r in rs) for f in ("total_s", "first_s", "rss_mb", "import_s")}
            med[key]["rate"] = statistics.median(r["samples"] / r["total_s"] for r in rs)
            later = [r["later_rate"] for r in rs if r.get("later_rate")]
            med[key]["later"] = statistics.median(later) if later else float("nan")
            med[key]["load"] = statistics.mean(r["load"] for r in rs)
    loads = [r["load"] for rs in results.values() for r in rs]
    print(f"\nmedians of {args.runs} fresh-process runs of {args.epochs} epoch(s); batch size {BATCH}; "
          f"python {sys.version.split()[0]}, numpy {np.__version__}; {os.cpu_count()} CPUs, "
          f"load average {min(loads, default=0):.1f}-{max(loads, default=0):.1f} during the runs\n")
    print("| dataset | cache | how | library | epoch 1 samples/s | later epochs samples/s | MB/s (later) "
          "| first batch s | peak RSS MB (sum) | import s | load |")
    print("|---|---|---|---|---:|---:|---:|---:|---:|---:|---:|")
    for (name, cache, how, lib), m in med.items():
        mb = dataset_bytes(root, name) / 1e6
        workers = how[len("loader"):]
        what = "for s in ds" if how == "iter" else (
            f"Loader(num_workers={workers})" if lib == "astream" else f"DataLoader(num_workers={workers})")
        later = "" if m["later"] != m["later"] else f"{m['later']:,.0f}"  # NaN with --epochs 1
        later_mb = "" if not later else f"{m['later'] * mb / len_of(name):,.1f}"
        print(f"| {name} | {cache} | {what} | {lib} | {m['rate']:,.0f} | {later} "
              f"| {later_mb} | {m['first_s']:.3f} | {m['rss_mb']:,.0f} "
              f"| {m['import_s']:.2f} | {m['load']:.1f} |")
    print("\nastream / mosaic (throughput: higher is better; first batch and RSS: lower is better). "
          "Epoch 1 counts from the dataset's construction (worker start, cold cache where it is cold); "
          "later epochs read a warm cache and start their workers again, as training does.\n")
    print("| dataset | cache | how | throughput, epoch 1 | throughput, later epochs | first batch | peak RSS |")
    print("|---|---|---|---:|---:|---:|---:|")
    hows = sorted({key[2] for key in med})
    for name, cache, how in itertools.product(DATASETS, CACHES, hows):
        a, p = med.get((name, cache, how, "astream")), med.get((name, cache, how, "mosaic"))
        if a is None or p is None:
            continue
        target = 2.0 if name == "large" else (20.0 if how.startswith("loader") else 3.0)
        later = _fmt_ratio(a["later"] / p["later"], target, True) if args.epochs > 1 else ""
        print(f"| {name} | {cache} | {how} | {_fmt_ratio(a['rate'] / p['rate'], target, True)} | {later} "
              f"| {_fmt_ratio(a['first_s'] / p['first_s'], 0.25, False)} "
              f"| {_fmt_ratio(a['rss_mb'] / p['rss_mb'], 0.5, False)} |")


def len_of(name: str) -> int:
    return 200_000 if name == "small" else 2_000


if __name__ == "__main__":
    main()
