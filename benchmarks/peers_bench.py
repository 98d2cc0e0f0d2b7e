"""astream, LitData and mosaicml-streaming side by side: the eight configurations of issue 22.

What it does:

1. Builds (once) under ``--data`` (default $ASTREAM_BENCH_DATA/peers or
   <tmp>/astream-bench/peers) two uncompressed MDS datasets with astream's writer —
   ``small``: 50,000 x ~1 KB (``id: int``, ``name: str``, ``payload: bytes``, 8 MB
   shards); ``large``: 1,000 x 100 KB (``x: ndarray:float32:25600``, 64 MB shards) —
   and the same samples converted for LitData with ``litdata.optimize`` (in LitData's
   interpreter, ``--litdata-python``).
2. For each configuration (shuffle no/yes x small/large x 0/2 workers) runs each
   library ``--runs`` times, each run in a fresh process, the libraries alternated:
   one epoch, batch 32, warm page cache (the driver reads every file first), timed from
   before the dataset's construction (imports excluded: they are reported apart).
   astream: ``Loader(StreamingDataset(local=...), num_workers=w)``; mosaicml:
   ``torch.utils.data.DataLoader(streaming.StreamingDataset(local=..., batch_size=32),
   batch_size=32, num_workers=w)``; LitData: ``StreamingDataLoader(StreamingDataset(
   input_dir=...), batch_size=32, num_workers=w)`` with a collate that keeps ``bytes``
   columns as lists (its default collate turns LitData's ``memoryview`` values into one
   tensor per byte position: wrong content, and 75x slower).
3. Prints a markdown table: medians in samples/s, astream over the faster peer.

``--start-cost`` instead measures where a worker process's start goes (forkserver,
fork and imports, event loop, joining the node agent), median of ``--runs``.

Usage::

    ASTREAM_PEER_PYTHON=<mosaicml venv>/bin/python \\
      .venv/bin/python benchmarks/peers_bench.py --litdata-python <litdata venv>/bin/python --runs 3
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

from child_env import code_env
from peer_stub import stub_streaming_vision

BENCH_DATA = Path(os.environ.get("ASTREAM_BENCH_DATA", Path(tempfile.gettempdir()) / "astream-bench"))
PEER_PYTHON = os.environ.get("ASTREAM_PEER_PYTHON", sys.executable)
BATCH = 32
SIZES = {"small": 50_000, "large": 1_000}
# ``--epoch-scale K``: astream's epoch is K times its dataset (``epoch_size``), so that it
# lasts long enough (>= 5 s) for workers' start not to decide the comparison.
EPOCH_SCALE = 1


def _sample(name: str, i: int) -> dict[str, Any]:
    import numpy as np

    if name == "small":
        return {"id": i, "name": f"name-{i}-abcdefghij", "payload": bytes([i % 251]) * 900}
    return {"x": np.full(25600, i, np.float32)}


def build(root: Path) -> None:
    from astream import MDSWriter

    specs = {
        "small": ({"id": "int", "name": "str", "payload": "bytes"}, "8mb"),
        "large": ({"x": "ndarray:float32:25600"}, "64mb"),
    }
    for name, (columns, limit) in specs.items():
        out = root / name
        if (out / "index.json").exists():
            continue
        with MDSWriter(out=str(out), columns=columns, size_limit=limit) as writer:
            for i in range(SIZES[name]):
                writer.write(_sample(name, i))


# -- in LitData's interpreter ------------------------------------------------------------------
def _lit_sample(index: int) -> dict[str, Any]:
    return _sample(os.environ["PEERS_BENCH_SET"], index)


def lit_build(root: Path) -> None:
    import litdata

    for name in SIZES:
        out = root / f"lit-{name}"
        if (out / "index.json").exists():
            continue
        os.environ["PEERS_BENCH_SET"] = name
        litdata.optimize(fn=_lit_sample, inputs=list(range(SIZES[name])), output_dir=str(out),
                         chunk_bytes="32MB", num_workers=2)


def _keep_bytes(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """Collate for LitData: arrays stacked (torch), bytes/str/ints kept as lists."""
    import torch

    out: dict[str, Any] = {}
    for key in samples[0]:
        values = [s[key] for s in samples]
        first = values[0]
        if isinstance(first, memoryview):
            out[key] = [bytes(v) for v in values]
        elif hasattr(first, "shape"):
            out[key] = torch.stack([torch.as_tensor(v) for v in values])
        else:
            out[key] = values
    return out


# -- one run (a fresh process) ------------------------------------------------------------------
def _epoch(loader: Any, start: float) -> dict[str, float]:
    n = 0
    first = None
    for batch in loader:
        col = batch["id"] if "id" in batch else batch["x"]
        n += len(col)
        if first is None:
            first = time.perf_counter() - start
    wall = time.perf_counter() - start
    return {"samples": n, "wall_s": wall, "rate": n / wall, "first_s": first or 0.0}


def run_astream(root: Path, name: str, shuffle: bool, workers: int) -> dict[str, float]:
    t0 = time.perf_counter()
    from astream import Loader, StreamingDataset

    imported = time.perf_counter() - t0
    start = time.perf_counter()
    epoch_size = SIZES[name] * EPOCH_SCALE if EPOCH_SCALE > 1 else None
    ds = StreamingDataset(local=str(root / name), batch_size=BATCH, shuffle=shuffle, epoch_size=epoch_size)
    with Loader(ds, num_workers=workers) as loader:
        out = _epoch(loader, start)
    ds.close()
    return {**out, "import_s": imported}


def run_mosaic(root: Path, name: str, shuffle: bool, workers: int) -> dict[str, float]:
    import warnings

    warnings.simplefilter("ignore")
    stub_streaming_vision()
    t0 = time.perf_counter()
    from streaming import StreamingDataset
    from torch.utils.data import DataLoader

    imported = time.perf_counter() - t0
    start = time.perf_counter()
    ds = StreamingDataset(local=str(root / name), batch_size=BATCH, shuffle=shuffle)
    out = _epoch(DataLoader(ds, batch_size=BATCH, num_workers=workers), start)
    return {**out, "import_s": imported}


def run_litdata(root: Path, name: str, shuffle: bool, workers: int) -> dict[str, float]:
    import warnings

    warnings.simplefilter("ignore")
    t0 = time.perf_counter()
    from litdata import StreamingDataLoader, StreamingDataset

    imported = time.perf_counter() - t0
    start = time.perf_counter()
    ds = StreamingDataset(input_dir=str(root / f"lit-{name}"), shuffle=shuffle)
    out = _epoch(StreamingDataLoader(ds, batch_size=BATCH, num_workers=workers, collate_fn=_keep_bytes), start)
    return {**out, "import_s": imported}


def run_base(root: Path, name: str, shuffle: bool, workers: int) -> dict[str, float]:
    """astream as an older checkout (``--base``) has it: the child put it first on the path."""
    return run_astream(root, name, shuffle, workers)


RUNNERS = {"astream": run_astream, "base": run_base, "mosaicml": run_mosaic, "litdata": run_litdata}


# -- the worker start cost ------------------------------------------------------------------------
def _start_probe(conn: Any, root: str, t_asked: float) -> None:
    """In a worker process: the time of each step of its start, as a worker takes them."""
    marks = {"entered": time.time() - t_asked}
    from astream import StreamingDataset
    from astream._storage.loop import new_event_loop

    marks["imports"] = time.time() - t_asked
    loop = new_event_loop()
    marks["loop"] = time.time() - t_asked
    ds = StreamingDataset(local=root, batch_size=BATCH)
    loop.run_until_complete(ds.node())
    marks["agent"] = time.time() - t_asked
    loop.run_until_complete(ds.aclose())
    loop.close()
    conn.send(marks)
    conn.close()


def _nothing() -> None:
    pass


def start_cost(root: Path) -> dict[str, float]:
    """One fresh process: the forkserver's start, then one worker's steps (seconds)."""
    from astream import StreamingDataset
    from astream._dataset.loader import _EpochJob
    from astream._dataset.startup import WorkerStart, process_context

    ds = StreamingDataset(local=str(root / "small"), batch_size=BATCH)
    from astream._dataset.runtime import portal

    portal().call(ds.node())  # the rank's own agent connection, as a Loader has it first
    ctx = process_context(_EpochJob.__module__, WorkerStart(import_main=False))
    from multiprocessing import forkserver

    t = time.time()
    forkserver.ensure_running()
    first = ctx.Process(target=_nothing)  # type: ignore[attr-defined]
    first.start()  # waits for the server's preloads (astream, numpy)
    first.join()
    out = {"forkserver_and_preloads": time.time() - t}
    here, there = ctx.Pipe(duplex=False)
    t = time.time()
    proc = ctx.Process(target=_start_probe, args=(there, str(root / "small"), t))  # type: ignore[attr-defined]
    proc.start()
    out["fork_return"] = time.time() - t
    there.close()
    marks = here.recv()
    proc.join()
    ds.close()
    prev = 0.0
    for step in ("entered", "imports", "loop", "agent"):  # each step's own time
        out[step] = marks[step] - prev
        prev = marks[step]
    out["worker_total"] = prev
    return out


# -- the driver ---------------------------------------------------------------------------------
def _warm(root: Path) -> None:
    for path in root.rglob("*"):
        if path.is_file():
            with open(path, "rb") as f:
                while f.read(1 << 24):
                    pass



def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--data", default=str(BENCH_DATA / "peers"))
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--peer-python", default=PEER_PYTHON)
    p.add_argument("--litdata-python", default=os.environ.get("ASTREAM_LITDATA_PYTHON"))
    p.add_argument("--libs", nargs="*", default=list(RUNNERS))
    p.add_argument("--only", nargs="*", default=None, help="datasets (small, large)")
    p.add_argument("--base", default=None,
                   help="an extracted older astream package (git archive <commit> astream | tar -x -C DIR): "
                        "a column 'base' beside this checkout's")
    p.add_argument("--workers-list", type=int, nargs="*", default=[0, 2], help="worker counts to run")
    p.add_argument("--epoch-scale", type=int, default=1,
                   help="astream only: an epoch of this many times the dataset (epoch_size), for epochs of >= 5 s")
    p.add_argument("--start-cost", action="store_true", help="measure a worker's start instead")
    p.add_argument("--child", default=None, help=argparse.SUPPRESS)
    p.add_argument("--lit-build", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--dataset", default="small", help=argparse.SUPPRESS)
    p.add_argument("--shuffle", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--workers", type=int, default=0, help=argparse.SUPPRESS)
    args = p.parse_args()
    global EPOCH_SCALE
    EPOCH_SCALE = args.epoch_scale
    root = Path(args.data)
    if args.lit_build:
        lit_build(root)
        return
    if args.child == "start":
        print(json.dumps(start_cost(root)))
        return
    if args.child:
        if args.child == "base":
            # The older package ahead of this checkout's (and of an editable install's finder).
            sys.meta_path[:] = [f for f in sys.meta_path if "editable" not in str(f)]
            sys.path.insert(0, args.base)
        print(json.dumps(RUNNERS[args.child](root, args.dataset, args.shuffle, args.workers)))
        return
    build(root)
    pythons = {"astream": sys.executable, "base": sys.executable if args.base else None,
               "mosaicml": args.peer_python, "litdata": args.litdata_python}
    env = dict(os.environ)
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # fresh processes import compiled bytecode, as installed
    env["PYTHONPYCACHEPREFIX"] = str(root / "pycache")
    if args.start_cost:
        rows = [json.loads(subprocess.run([sys.executable, __file__, "--child", "start", "--data", str(root)],
                                          capture_output=True, text=True, check=True, timeout=300, env=env)
                           .stdout.strip().splitlines()[-1]) for _ in range(args.runs)]
        print(f"worker start, median of {args.runs} fresh processes (load {os.getloadavg()[0]:.1f}):")
        for key in rows[0]:
            print(f"- {key}: {statistics.median(r[key] for r in rows) * 1e3:.1f} ms")
        return
    libs = [lib for lib in args.libs if pythons.get(lib)]
    if EPOCH_SCALE > 1 and set(libs) - {"astream", "base"}:
        p.error("--epoch-scale applies to astream only: add --libs astream (and base)")
    if "litdata" in libs:
        subprocess.run([pythons["litdata"], __file__, "--lit-build", "--data", str(root)], check=True, timeout=1800)
    _warm(root)
    configs = [(shuffle, name, workers) for shuffle in (False, True) for name in (args.only or ("small", "large"))
               for workers in args.workers_list]
    results: dict[tuple[Any, ...], list[dict[str, float]]] = {}
    loads: list[float] = []
    for _ in range(args.runs):
        for shuffle, name, workers in configs:
            for lib in libs:
                cmd = [pythons[lib], __file__, "--child", lib, "--data", str(root), "--dataset", name,
                       "--workers", str(workers)] + (["--shuffle"] if shuffle else [])
                cmd += ["--base", args.base] if lib == "base" else []
                cmd += ["--epoch-scale", str(EPOCH_SCALE)]
                out = subprocess.run(cmd, capture_output=True, text=True, timeout=900, **code_env(env, lib, args.base))
                if out.returncode:
                    print(f"{lib} {name} shuffle={shuffle} workers={workers} failed:\n{out.stderr[-2000:]}",
                          file=sys.stderr)
                    continue
                results.setdefault((shuffle, name, workers, lib), []).append(
                    json.loads(out.stdout.strip().splitlines()[-1]))
                loads.append(os.getloadavg()[0])
    print(f"load average {min(loads):.1f}-{max(loads):.1f}; samples/s, median of {args.runs}")
    print("| shuffle | samples | workers | " + " | ".join(libs) + " | astream / faster peer |")
    print("|---|---|---|" + "---:|" * (len(libs) + 1))
    for shuffle, name, workers in configs:
        meds = {}
        for lib in libs:
            runs = results.get((shuffle, name, workers, lib), [])
            meds[lib] = statistics.median(r["rate"] for r in runs) if runs else float("nan")
        peers = [v for lib, v in meds.items() if lib not in ("astream", "base") and v == v]
        ratio = f"{meds['astream'] / max(peers):.2f}x" if peers and "astream" in meds else "-"
        label = "50k x ~1 KB" if name == "small" else "1k x 100 KB"
        cells = " | ".join(f"{meds[lib]:,.0f}" for lib in libs)
        print(f"| {'yes' if shuffle else 'no'} | {label} | {workers} | {cells} | {ratio} |")
    if EPOCH_SCALE > 1:
        print(f"\nepochs of {EPOCH_SCALE} x the dataset; wall s (median) and workers against none:")
        for shuffle, name, workers in configs:
            for lib in libs:
                runs = results.get((shuffle, name, workers, lib), [])
                zero = results.get((shuffle, name, 0, lib), [])
                if runs and zero and workers:
                    ratio = statistics.median(r["rate"] for r in runs) / statistics.median(r["rate"] for r in zero)
                    print(f"- {lib} {name} shuffle={shuffle}: {workers} workers "
                          f"{statistics.median(r['wall_s'] for r in runs):.1f} s, 0 workers "
                          f"{statistics.median(r['wall_s'] for r in zero):.1f} s: {ratio:.2f}x")


if __name__ == "__main__":
    main()
