"""Streaming Parquet: astream's ``format="parquet"`` against pyarrow's own reader, same files.

The floor is what a hand-written loader gets from pyarrow: ``ParquetFile.iter_batches`` over
every file in order, each record batch turned into NumPy arrays (numbers) and lists
(strings), as astream's batches come out. astream reads the same files through a
``StreamingDataset`` (no shuffle, ``Loader(num_workers=0)``, the same batch size):

- ``warm``: its cache already holds every row group (a second epoch);
- ``cold``: a fresh cache, the row groups fetched by range from the local folder (or, with
  ``--http``, from a loopback HTTP server serving it with the written index).

Both sides run alternately in one process, ``--runs`` times; the page reports medians and
the ratio astream / floor (rows per second).

    python benchmarks/parquet_bench.py                     # 4 files x 8 row groups x 32768 rows
    python benchmarks/parquet_bench.py --rows 16384 --runs 5 --http
"""

from __future__ import annotations

import argparse
import shutil
import statistics
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


def astream_pass(remote: str, cache: Path, epochs: int) -> tuple[float, int]:
    """The last of ``epochs`` epochs (1: a cold pass, 2: a warm one): (seconds, rows)."""
    ds = StreamingDataset(remote=remote, local=str(cache), format="parquet", batch_size=BATCH)
    loader = Loader(ds, num_workers=0, drop_last=False)
    try:
        for _ in range(epochs - 1):
            for _ in loader:
                pass
        start = time.perf_counter()
        rows = sum(len(b["id"]) for b in loader)
        return time.perf_counter() - start, rows
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
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="parquet-bench-"))
    data = work / "data"
    data.mkdir()
    total = write(data, args.files, args.groups, args.rows)
    size = sum(p.stat().st_size for p in data.glob("*.parquet"))
    print(f"{args.files} files x {args.groups} row groups x {args.rows} rows = {total} rows, {size / 1e6:.1f} MB")
    results: dict[str, list[float]] = {"floor": [], "warm": [], "cold": []}
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
                seconds, rows = astream_pass(remote, cache, epochs)
                assert rows == total
                results[kind].append(rows / seconds)
            print(f"run {run}: " + ", ".join(f"{k} {v[-1]:,.0f} rows/s" for k, v in results.items()))
    finally:
        if server is not None:
            server.__exit__(None, None, None)
        shutil.rmtree(work, ignore_errors=True)
    med = {k: statistics.median(v) for k, v in results.items()}
    print("medians: " + ", ".join(f"{k} {v:,.0f} rows/s" for k, v in med.items()))
    print(f"astream warm / floor = {med['warm'] / med['floor']:.2f}x, cold / floor = {med['cold'] / med['floor']:.2f}x")


if __name__ == "__main__":
    main()
