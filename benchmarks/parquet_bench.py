"""Streaming Parquet: astream's ``format="parquet"`` against pyarrow's own reader, same files.

The floor is what a hand-written loader gets from pyarrow: ``ParquetFile.iter_batches`` over
every file in order, each record batch turned into NumPy arrays (numbers) and lists
(strings), as astream's batches come out. astream reads the same files through a
``StreamingDataset`` (no shuffle, ``Loader(num_workers=0)``, the same batch size):

- ``warm``: its cache already holds every row group (a second epoch);
- ``cold``: a fresh cache, the row groups fetched by range from the local folder (or, with
  ``--http``, from a loopback HTTP server serving it with the written index).

With ``--hf-python PYTHON`` (an interpreter with Hugging Face ``datasets`` installed; it is
not a dependency of astream), Hugging Face's streaming reader of the same files runs too,
in a subprocess of that interpreter: ``load_dataset("parquet", data_files=..., streaming=True)``
iterated in batches of the same size, numbers turned into NumPy arrays; its time to the
first batch is reported beside astream's (cold cache).

Both sides run alternately, ``--runs`` times; the page reports medians and the ratio
astream / floor (rows per second).

    python benchmarks/parquet_bench.py                     # 4 files x 8 row groups x 32768 rows
    python benchmarks/parquet_bench.py --rows 16384 --runs 5 --http
    python benchmarks/parquet_bench.py --hf-python "$VENV/bin/python"
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from astream import Loader, StreamingDataset
from astream.cli import main as cli
from astream.testing import LoopbackServer

BATCH = 256


def write(root: Path, files: int, groups: int, rows: int) -> int:
    rng = np.random.default_rng(0)
    total = 0
    for f in range(files):
        n = groups * rows
        ids = np.arange(total, total + n)
        table = pa.table({
            "id": pa.array(ids, pa.int64()),
            "x": pa.array(rng.random(n, dtype=np.float32)),
            "label": pa.array((ids % 1000).astype(np.int32)),
            "text": pa.array([f"row {i} " + "w" * int(i % 40) for i in ids]),
        })
        pq.write_table(table, root / f"part-{f:03d}.parquet", row_group_size=rows)
        total += n
    return total


def floor(root: Path) -> tuple[float, int]:
    """pyarrow's iter_batches -> NumPy/list batches: (seconds, rows)."""
    start = time.perf_counter()
    rows = 0
    for path in sorted(root.glob("*.parquet")):
        for rb in pq.ParquetFile(path).iter_batches(batch_size=BATCH):
            batch: dict[str, Any] = {}
            for name, col in zip(rb.schema.names, rb.columns, strict=True):
                batch[name] = col.to_pylist() if pa.types.is_string(col.type) else col.to_numpy()
            rows += len(batch["id"])
    return time.perf_counter() - start, rows


# Timed from after the import (astream's side is imported already), like astream's cold pass:
# constructing the dataset, then every batch.
_HF = """
import json, sys, time
import numpy as np
from datasets import load_dataset
t0 = time.perf_counter()
ds = load_dataset("parquet", data_files=sys.argv[1:], split="train", streaming=True)
rows, first = 0, None
for batch in ds.iter(batch_size=BATCH):
    out = {k: (v if isinstance(v[0], str) else np.asarray(v)) for k, v in batch.items()}
    rows += len(out["id"])
    if first is None:
        first = time.perf_counter() - t0
first_pass = time.perf_counter() - t0
# Resumption: iterate to 90% of the epoch, take the state, then time a fresh dataset from
# its construction and load_state_dict to the first batch.
it = load_dataset("parquet", data_files=sys.argv[1:], split="train", streaming=True).batch(BATCH)
seen, state = 0, None
for b in it:
    seen += len(b["id"])
    if state is None and seen >= 0.9 * rows:
        state = it.state_dict()
t1 = time.perf_counter()
again = load_dataset("parquet", data_files=sys.argv[1:], split="train", streaming=True).batch(BATCH)
again.load_state_dict(state)
for b in again:
    break
resume = time.perf_counter() - t1
print(json.dumps({"seconds": first_pass, "rows": rows, "first": first, "resume": resume}), flush=True)
""".replace("BATCH", str(BATCH))


def hf_pass(python: str, root: Path) -> tuple[float, int, float, float]:
    """Hugging Face datasets streaming, in ``python``: (seconds, rows, first batch s, resume s)."""
    files = [str(p) for p in sorted(root.glob("*.parquet"))]
    out = subprocess.run([python, "-c", _HF, *files], check=True, capture_output=True, text=True).stdout
    got = json.loads(out.strip().splitlines()[-1])
    return got["seconds"], got["rows"], got["first"], got["resume"]


def astream_resume(remote: str, cache: Path, total: int) -> float:
    """A fresh dataset (cold cache) resumed at 90% of the epoch: seconds from its construction
    and ``load_state_dict`` to the first batch."""
    start = time.perf_counter()
    ds = StreamingDataset(remote=remote, local=str(cache), format="parquet", batch_size=BATCH)
    loader = Loader(ds, num_workers=0, drop_last=False)
    try:
        loader.load_state_dict({**loader.state_dict(), "sample_in_epoch": int(0.9 * total)})
        next(iter(loader))
        return time.perf_counter() - start
    finally:
        loader.close()
        ds.close()


def astream_pass(remote: str, cache: Path, epochs: int) -> tuple[float, int, float]:
    """The last of ``epochs`` epochs (1: a cold pass, 2: a warm one): (seconds, rows, first batch s)."""
    t0 = time.perf_counter()
    ds = StreamingDataset(remote=remote, local=str(cache), format="parquet", batch_size=BATCH)
    loader = Loader(ds, num_workers=0, drop_last=False)
    try:
        for _ in range(epochs - 1):
            for _ in loader:
                pass
        start = time.perf_counter() if epochs > 1 else t0
        rows, first = 0, 0.0
        for b in loader:
            if not rows:
                first = time.perf_counter() - start
            rows += len(b["id"])
        return time.perf_counter() - start, rows, first
    finally:
        loader.close()
        ds.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--files", type=int, default=4)
    parser.add_argument("--groups", type=int, default=8)
    parser.add_argument("--rows", type=int, default=32768)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--http", action="store_true", help="astream reads over loopback HTTP")
    parser.add_argument("--hf-python", help="an interpreter with Hugging Face datasets: compare its streaming")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="parquet-bench-"))
    data = work / "data"
    data.mkdir()
    total = write(data, args.files, args.groups, args.rows)
    size = sum(p.stat().st_size for p in data.glob("*.parquet"))
    print(f"{args.files} files x {args.groups} row groups x {args.rows} rows = {total} rows, {size / 1e6:.1f} MB")
    results: dict[str, list[float]] = {"floor": [], "warm": [], "cold": []}
    firsts: dict[str, list[float]] = {"cold": []}
    resumes: dict[str, list[float]] = {"astream": []}
    if args.hf_python:
        results["hf"], firsts["hf"], resumes["hf"] = [], [], []
    server = None
    try:
        remote = str(data)
        if args.http:
            cli(["-q", "index", str(data)])
            server = LoopbackServer(str(data)).__enter__()
            remote = server.url
        floor(data)  # page cache and imports warm for both sides
        for run in range(args.runs):
            seconds, rows = floor(data)
            assert rows == total
            results["floor"].append(rows / seconds)
            cache = work / f"cache-{run}"
            for kind, epochs in (("cold", 1), ("warm", 2)):
                shutil.rmtree(cache, ignore_errors=True)
                seconds, rows, first = astream_pass(remote, cache, epochs)
                assert rows == total
                results[kind].append(rows / seconds)
                if kind == "cold":
                    firsts["cold"].append(first)
            shutil.rmtree(cache, ignore_errors=True)
            resumes["astream"].append(astream_resume(remote, cache, total))
            if args.hf_python:
                seconds, rows, first, resume = hf_pass(args.hf_python, data)
                assert rows == total
                results["hf"].append(rows / seconds)
                firsts["hf"].append(first)
                resumes["hf"].append(resume)
            print(f"run {run}: " + ", ".join(f"{k} {v[-1]:,.0f} rows/s" for k, v in results.items()))
    finally:
        if server is not None:
            server.__exit__(None, None, None)
        shutil.rmtree(work, ignore_errors=True)
    med = {k: statistics.median(v) for k, v in results.items()}
    print("medians: " + ", ".join(f"{k} {v:,.0f} rows/s" for k, v in med.items()))
    print(f"astream warm / floor = {med['warm'] / med['floor']:.2f}x, cold / floor = {med['cold'] / med['floor']:.2f}x")
    print("first batch (cold, from constructing the dataset): " + ", ".join(
        f"{k} {statistics.median(v) * 1e3:.0f} ms" for k, v in firsts.items()))
    print("resume at 90% to the first batch (cold): " + ", ".join(
        f"{k} {statistics.median(v) * 1e3:.0f} ms" for k, v in resumes.items()))
    if "hf" in med:
        print(f"astream warm / hf = {med['warm'] / med['hf']:.2f}x, cold / hf = {med['cold'] / med['hf']:.2f}x")


if __name__ == "__main__":
    main()
