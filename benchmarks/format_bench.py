"""Write and read throughput of the MDS format: astream vs mosaicml-streaming, same files.

Three datasets, written once per run by each writer from the same in-memory samples:

- ``small``: ~1 KB samples (``int`` id, a short ``str``, ~900 ``bytes``), the classic
  "many small records" case;
- ``large``: ~100 KB samples, one ``ndarray:float32:25600`` column (fixed size);
- ``fixed``: ~300 B samples whose columns are all fixed-size (``int``, ``float32``,
  ``ndarray:uint8:256``), the case ``get_batch`` vectorises completely.

Reads go over the files astream wrote (byte-identical to the peer's): per-sample
``ds[i]`` in a random order, then ``get_batch`` of 256 random ids; the peer's
``LocalDataset[i]`` reads the same ids. Figures are medians of ``--runs`` runs. astream's
writer fsyncs every shard and index.json (the peer's does not); a second astream write
row with fsync stubbed out shows what that durability costs. The peer
side runs only where ``streaming`` is importable (a venv made as docs/bench/peer.md says).

    python benchmarks/format_bench.py                 # ~50 MB per dataset, 3 runs
    python benchmarks/format_bench.py --scale 0.2 --runs 5
"""

from __future__ import annotations

import argparse
import importlib.util
import os
import shutil
import statistics
import sys
import tempfile
import time
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
from peer_stub import stub_streaming_vision

from astream import LocalDataset, MDSWriter

SIZE_LIMIT = "16mb"
BATCH = 256


def _peer() -> Any:
    if importlib.util.find_spec("streaming") is None:
        return None
    stub_streaming_vision()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import streaming
    return streaming


def _datasets(scale: float) -> dict[str, tuple[dict[str, str], list[dict[str, Any]]]]:
    rng = np.random.default_rng(0)
    words = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta"]
    n_small, n_large, n_fixed = int(50_000 * scale), int(500 * scale), int(160_000 * scale)
    small = [
        {"id": i, "name": " ".join(words[(i + k) % 6] for k in range(3)), "payload": rng.bytes(900)}
        for i in range(n_small)
    ]
    large = [{"x": rng.standard_normal(25_600).astype(np.float32)} for _ in range(n_large)]
    fixed = [
        {"id": i, "score": float(i) / 3, "feat": rng.integers(0, 256, 256, dtype=np.uint8)} for i in range(n_fixed)
    ]
    return {
        "small": ({"id": "int", "name": "str", "payload": "bytes"}, small),
        "large": ({"x": "ndarray:float32:25600"}, large),
        "fixed": ({"id": "int", "score": "float32", "feat": "ndarray:uint8:256"}, fixed),
    }


def _timed(fn: Callable[[], Any]) -> float:
    start = time.perf_counter()
    fn()
    return time.perf_counter() - start


def _write(writer_cls: Callable[..., Any], out: Path, columns: dict[str, str], samples: list[dict[str, Any]]) -> float:
    shutil.rmtree(out, ignore_errors=True)
    os.sync()  # start each writer with no dirty pages of the previous one still in flight
    start = time.perf_counter()
    with writer_cls(out=str(out), columns=columns, size_limit=SIZE_LIMIT) as writer:
        for sample in samples:
            writer.write(sample)
    return time.perf_counter() - start


def _write_without_fsync(out: Path, columns: dict[str, str], samples: list[dict[str, Any]]) -> float:
    """astream's writer with fsync stubbed out: how much of its time is durability."""
    real = os.fsync
    os.fsync = lambda fd: None
    try:
        return _write(MDSWriter, out, columns, samples)
    finally:
        os.fsync = real


def _collate(samples: list[dict[str, Any]]) -> dict[str, Any]:
    first = samples[0]
    return {
        k: np.stack([s[k] for s in samples]) if isinstance(first[k], (np.ndarray, np.generic, int))
        else [s[k] for s in samples]
        for k in first
    }


def _bench(name: str, columns: dict[str, str], samples: list[dict[str, Any]], work: Path, runs: int,
           peer: Any) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {}

    def add(key: str, seconds: float) -> None:
        times.setdefault(key, []).append(seconds)

    n = len(samples)
    rng = np.random.default_rng(1)
    order = rng.permutation(n)
    batches = [order[k : k + BATCH] for k in range(0, n, BATCH)]
    ours_dir, theirs_dir = work / f"{name}-astream", work / f"{name}-peer"
    for _ in range(runs):
        add("write astream (no fsync)", _write_without_fsync(ours_dir, columns, samples))
        add("write astream", _write(MDSWriter, ours_dir, columns, samples))
        if peer is not None:
            add("write peer", _write(peer.MDSWriter, theirs_dir, columns, samples))
        with LocalDataset(ours_dir) as ds:
            ds.get_batch([0])  # open lazily-mapped shards outside the timed region: both sides
            for shard in range(ds.num_shards):
                ds.shard(shard)
            add("get astream", _timed(lambda ds=ds: [ds[i] for i in order.tolist()]))
            add("get_batch astream", _timed(lambda ds=ds: [ds.get_batch(b) for b in batches]))
            # What a batch costs with per-sample reads: the samples, then one array per column.
            add("get+stack astream", _timed(lambda ds=ds: [_collate([ds[i] for i in b.tolist()]) for b in batches]))
        if peer is not None:
            theirs = peer.base.LocalDataset(local=str(ours_dir))
            add("get peer", _timed(lambda theirs=theirs: [theirs[i] for i in order.tolist()]))
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--scale", type=float, default=1.0, help="dataset size factor (1.0: ~50 MB each)")
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--only", nargs="*", default=None, help="dataset names to run (small, large, fixed)")
    args = parser.parse_args()
    peer = _peer()
    work = Path(tempfile.mkdtemp(prefix="format-bench-"))
    rows = []
    try:
        for name, (columns, samples) in _datasets(args.scale).items():
            if args.only and name not in args.only:
                continue
            times = _bench(name, columns, samples, work, args.runs, peer)
            nbytes = sum(p.stat().st_size for p in (work / f"{name}-astream").glob("shard.*"))
            medians = {k: statistics.median(v) for k, v in times.items()}
            for key, seconds in medians.items():
                rows.append((name, key, len(samples) / seconds, nbytes / seconds / 1e6, seconds))
            print(f"{name}: {len(samples)} samples, {nbytes / 1e6:.1f} MB", file=sys.stderr)
            _ratios(name, medians)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    print(f"\nmedian of {args.runs} runs; python {sys.version.split()[0]}, numpy {np.__version__}, "
          f"peer {'mosaicml-streaming ' + peer.__version__ if peer else 'not installed'}\n")
    print("| dataset | operation | samples/s | MB/s | seconds |")
    print("|---|---|---:|---:|---:|")
    for name, key, rate, mbs, seconds in rows:
        print(f"| {name} | {key} | {rate:,.0f} | {mbs:,.1f} | {seconds:.3f} |")
    print()
    for line in RATIOS:
        print(line)


RATIOS: list[str] = []


def _ratios(name: str, m: dict[str, float]) -> None:
    RATIOS.append(f"- {name}: get_batch({BATCH}) vs get: {m['get astream'] / m['get_batch astream']:.1f}x faster; "
                  f"vs get+stack: {m['get+stack astream'] / m['get_batch astream']:.1f}x faster")
    if "get peer" in m:
        RATIOS.append(f"- {name}: astream get / peer get = {m['get peer'] / m['get astream']:.1f}x faster")
        RATIOS.append(f"- {name}: astream get_batch / peer get = {m['get peer'] / m['get_batch astream']:.1f}x faster")
        RATIOS.append(f"- {name}: write time astream / peer = {m['write astream'] / m['write peer']:.2f} "
                      f"(without fsync: {m['write astream (no fsync)'] / m['write peer']:.2f})")


if __name__ == "__main__":
    main()
