"""Streaming Parquet: astream's ``format="parquet"`` against pyarrow's own reader, same files.

The floor is what a hand-written loader gets from pyarrow: ``ParquetFile.iter_batches`` over
every file in order, each record batch turned into NumPy arrays (numbers) and lists
(strings), as astream's batches come out. astream reads the same files through a
``StreamingDataset`` (no shuffle, ``Loader(num_workers=0)``, the same batch size):

- ``warm``: its cache already holds every row group (a second epoch);
- ``cold``: a fresh cache, the row groups fetched by range from the local folder (or, with
  ``--http``, from ``astream serve`` in a process of its own, with the written index).

With ``--hf-python PYTHON`` (an interpreter with Hugging Face ``datasets`` installed; it is
not a dependency of astream), Hugging Face's streaming reader of the same files runs too
(with ``--http`` over the same loopback server: its fsspec HTTP file system, which needs
``aiohttp`` in that interpreter; LitData reads the local folder either way),
in a subprocess of that interpreter: ``load_dataset("parquet", data_files=..., streaming=True)``
iterated in batches of the same size, numbers turned into NumPy arrays; its time to the
first batch is reported beside astream's (cold cache). ``--lit-python PYTHON`` does the same
with LitData's Parquet streaming (``index_parquet_dataset`` + ``ParquetLoader``, see
``_LIT``); docs/bench/peer.md says how to install it. Each peer also reports the time from a
fresh dataset's ``load_state_dict`` at 90% of the epoch to its first batch in hand (the
iteration is closed after the clock stops, on every side), ``--resumes`` times per run;
medians, quartiles and range over all runs. ``--resume-only`` skips astream's passes.

Both sides run alternately, ``--runs`` times; the page reports medians and the ratio
astream / floor (rows per second).

    python benchmarks/parquet_bench.py                     # 4 files x 8 row groups x 32768 rows
    python benchmarks/parquet_bench.py --rows 16384 --runs 5 --http
    python benchmarks/parquet_bench.py --hf-python "$VENV/bin/python"
    python benchmarks/parquet_bench.py --hf-python "$HF_VENV/bin/python" --lit-python "$LIT_VENV/bin/python"
    python benchmarks/parquet_bench.py --resume-only --resumes 30 --hf-python ... --lit-python ...
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from astream import Loader, StreamingDataset
from astream._cache.parquet_index import load_parquet_index
from astream._format.index import Index
from astream._format.parquet.reader import ParquetLayout, RowGroupReader
from astream._storage.registry import StoragePool
from astream.cli import main as cli

BATCH = 256
# Resumptions timed per side and run by default (a ~20 ms event on a shared machine spreads
# by 10x: medians of many, see --resumes).
RESUMES = 15


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
seen, state, at = 0, None, 0
for b in it:
    seen += len(b["id"])
    if state is None and seen >= 0.9 * rows:
        state, at = it.state_dict(), seen
resume, from_state, wrong = [], [], 0
for _ in range(RESUMES):
    t1 = time.perf_counter()
    again = load_dataset("parquet", data_files=sys.argv[1:], split="train", streaming=True).batch(BATCH)
    t2 = time.perf_counter()
    again.load_state_dict(state)
    batches = iter(again)
    b = next(batches)
    t3 = time.perf_counter()  # the first batch in hand: closing the iteration comes after
    resume.append(t3 - t1)
    from_state.append(t3 - t2)
    wrong += int(b["id"][0]) != at  # resumed where the state was taken?
    del batches
print(json.dumps({"seconds": first_pass, "rows": rows, "first": first, "resume": resume,
                  "from_state": from_state, "wrong": wrong}), flush=True)
""".replace("BATCH", str(BATCH))


def hf_pass(python: str, files: list[str], resumes: int) -> dict[str, Any]:
    """Hugging Face datasets streaming of ``files`` (paths, or URLs of the loopback server:
    its fsspec HTTP file system, which needs aiohttp in that interpreter), in ``python``:
    seconds and rows of its pass, first batch, ``resumes`` resumptions from construction
    and from ``load_state_dict``."""
    done = subprocess.run([python, "-c", _HF.replace("RESUMES", str(resumes)), *files], capture_output=True,
                          text=True)
    # Its interpreter sometimes aborts on the way out ("terminate called without an active
    # exception": a native thread at shutdown), after the result line: that line counts.
    lines = done.stdout.strip().splitlines()
    if not lines or not lines[-1].startswith("{"):
        raise RuntimeError(f"the Hugging Face run failed ({done.returncode}): {done.stderr[-2000:]}")
    got: dict[str, Any] = json.loads(lines[-1])
    return got


# LitData: its Parquet streaming (index_parquet_dataset, then StreamingDataset with its
# ParquetLoader and StreamingDataLoader), torch tensors turned into NumPy arrays. The index
# is written once (timed apart, like `astream index`); the cold pass is timed from
# constructing the dataset; the state is taken at 90% of that pass; the warm pass is a
# second epoch of the same loader; "resume" is a fresh dataset and loader from their
# construction and load_state_dict to the first batch.
_LIT = """
import json, sys, time
import torch
from litdata import StreamingDataLoader, StreamingDataset, index_parquet_dataset
from litdata.streaming.item_loader import ParquetLoader
data, cache, total = sys.argv[1], sys.argv[2], int(sys.argv[3])
t0 = time.perf_counter()
index_parquet_dataset(data)
index_s = time.perf_counter() - t0
def make():
    ds = StreamingDataset(data, item_loader=ParquetLoader(), cache_dir=cache)
    return StreamingDataLoader(ds, batch_size=BATCH, num_workers=0)
def numpy(batch):
    return {k: (v.numpy() if isinstance(v, torch.Tensor) else v) for k, v in batch.items()}
t0 = time.perf_counter()
loader = make()
rows, first, state, at = 0, None, None, 0
for b in loader:
    rows += len(numpy(b)["id"])
    if first is None:
        first = time.perf_counter() - t0
    if state is None and rows >= 0.9 * total:
        state, at = loader.state_dict(), rows
cold = time.perf_counter() - t0
t0 = time.perf_counter()
warm_rows = sum(len(numpy(b)["id"]) for b in loader)
warm = time.perf_counter() - t0
resume, from_state = [], []
for _ in range(RESUMES):
    t0 = time.perf_counter()
    again = make()
    t1 = time.perf_counter()
    again.load_state_dict(state)
    batches = iter(again)
    resumed = numpy(next(batches))
    t2 = time.perf_counter()  # the first batch in hand: closing the iteration comes after
    resume.append(t2 - t0)
    from_state.append(t2 - t1)
    assert int(resumed["id"][0]) == at, (int(resumed["id"][0]), at)  # resumed where the state was taken
    del batches
print(json.dumps({"index": index_s, "cold": cold, "warm": warm, "rows": rows, "warm_rows": warm_rows,
                  "first": first, "resume": resume, "from_state": from_state}), flush=True)
""".replace("BATCH", str(BATCH))


def lit_pass(python: str, root: Path, work: Path, total: int, resumes: int) -> dict[str, Any]:
    """LitData's Parquet streaming, in ``python``, over hard links of ``root``'s files in a
    folder of its own (it writes its index.json there): seconds and rows of each pass, and
    ``resumes`` resumptions."""
    data = work / "lit-data"
    shutil.rmtree(data, ignore_errors=True)
    data.mkdir()
    for path in sorted(root.glob("*.parquet")):
        os.link(path, data / path.name)
    cache = work / "lit-cache"
    shutil.rmtree(cache, ignore_errors=True)
    out = subprocess.run([python, "-c", _LIT.replace("RESUMES", str(resumes)), str(data), str(cache), str(total)],
                         check=True, capture_output=True, text=True, cwd=work).stdout
    got: dict[str, Any] = json.loads(out.strip().splitlines()[-1])
    return got


def serve(root: Path) -> tuple[subprocess.Popen[str], str]:
    """``astream serve root`` in a process of its own (not a thread of this one, whose GIL
    astream's threads would share with it): the process and its URL."""
    proc = subprocess.Popen([sys.executable, "-m", "astream.cli", "-q", "serve", str(root), "--port", "0"],
                            stdout=subprocess.PIPE, text=True)
    assert proc.stdout is not None
    found = re.search(r"http://127\.0\.0\.1:\d+", proc.stdout.readline())
    if found is None:
        proc.kill()
        raise RuntimeError("astream serve did not start")
    return proc, found.group(0)


def astream_resume(remote: str, cache: Path, total: int) -> tuple[float, float]:
    """A fresh dataset (cold cache) resumed at 90% of the epoch: seconds to the first batch
    from its construction, and from ``load_state_dict``."""
    start = time.perf_counter()
    ds = StreamingDataset(remote=remote, local=str(cache), format="parquet", batch_size=BATCH)
    loader = Loader(ds, num_workers=0, drop_last=False)
    try:
        state = {**loader.state_dict(), "sample_in_epoch": int(0.9 * total)}
        loaded = time.perf_counter()
        loader.load_state_dict(state)
        batches = iter(loader)
        batch = next(batches)
        end = time.perf_counter()  # the first batch in hand: closing the iteration comes after
        assert int(batch["id"][0]) == int(0.9 * total)  # unshuffled: the row the state points at
        del batches  # (the loader's generator: closing it ends the iteration)
        return end - start, end - loaded
    finally:
        loader.close()
        ds.close()


def resume_floor(root: Path, cache: Path, total: int) -> dict[str, float]:
    """The work a cold resume cannot skip, done directly in this thread (no node agent, no
    engine, no loop thread): the index from the footers (astream's own code, its writes
    included), the row group's ranges read from the file into the cache, its decode and the
    first batch taken. Seconds of each step; what a resume costs above their sum is the
    orchestration (agent start, socket, engine, thread hops)."""
    index, index_s = asyncio.run(_floor_index(str(root), cache))
    t1 = time.perf_counter()
    start = int(0.9 * total)
    offsets = np.cumsum([0] + [sh.samples for sh in index.shards])
    k = int(np.searchsorted(offsets, start, side="right")) - 1
    info = index.shards[k]
    assert info.source is not None
    path = cache / f"floor.rg{k}"
    with open(root / info.source.file, "rb") as src, open(path, "wb") as out:
        for a, b in info.source.ranges:
            out.write(os.pread(src.fileno(), b - a, a))
    t2 = time.perf_counter()
    reader = RowGroupReader(str(path), ParquetLayout(info, str(root)), info)
    first = start - int(offsets[k])
    batch = reader.get_batch(np.arange(first, min(first + BATCH, info.samples)))
    t3 = time.perf_counter()
    assert int(batch["id"][0]) == start
    reader.close()
    return {"index": index_s, "fetch": t2 - t1, "decode": t3 - t2, "total": index_s + t3 - t1}


async def _floor_index(root: str, cache: Path) -> tuple[Index, float]:
    """The index as a dataset's construction builds it, timed inside a running loop."""
    async with StoragePool() as pool:
        start = time.perf_counter()
        index = await load_parquet_index(str(cache), root, None, None, pool)
        return index, time.perf_counter() - start


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
    parser.add_argument("--lit-python", help="an interpreter with litdata (and torch, polars): compare its "
                        "Parquet streaming")
    parser.add_argument("--resumes", type=int, default=RESUMES, help="resumptions timed per side and run")
    parser.add_argument("--resume-only", action="store_true", help="astream: time only the resumptions (and "
                        "their floor), not the passes")
    args = parser.parse_args()
    print(f"load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    work = Path(tempfile.mkdtemp(prefix="parquet-bench-"))
    data = work / "data"
    data.mkdir()
    total = write(data, args.files, args.groups, args.rows)
    size = sum(p.stat().st_size for p in data.glob("*.parquet"))
    print(f"{args.files} files x {args.groups} row groups x {args.rows} rows = {total} rows, {size / 1e6:.1f} MB")
    results: dict[str, list[float]] = {"floor": [], "warm": [], "cold": []}
    firsts: dict[str, list[float]] = {"cold": []}
    resumes: dict[str, list[float]] = {"astream": []}
    from_state: dict[str, list[float]] = {"astream": []}
    floors: dict[str, list[float]] = {}
    if args.hf_python:
        results["hf"], firsts["hf"], resumes["hf"], from_state["hf"] = [], [], [], []
    if args.lit_python:
        results["lit cold"], results["lit warm"], firsts["lit"], resumes["lit"], from_state["lit"] = [], [], [], [], []
        lit_index: list[float] = []
    hf_wrong = 0
    server: subprocess.Popen[str] | None = None
    try:
        remote = str(data)
        hf_files = [str(p) for p in sorted(data.glob("*.parquet"))]
        if args.http:
            cli(["-q", "index", str(data)])
            server, remote = serve(data)
            hf_files = [f"{remote}/{os.path.basename(p)}" for p in hf_files]  # HF reads them over HTTP too
        floor(data)  # page cache and imports warm for both sides
        for run in range(args.runs):
            cache = work / f"cache-{run}"
            for kind, epochs in () if args.resume_only else (("cold", 1), ("warm", 2)):
                shutil.rmtree(cache, ignore_errors=True)
                seconds, rows, first = astream_pass(remote, cache, epochs)
                assert rows == total
                results[kind].append(rows / seconds)
                if kind == "cold":
                    firsts["cold"].append(first)
            if not args.resume_only:
                seconds, rows = floor(data)
                assert rows == total
                results["floor"].append(rows / seconds)
            shutil.rmtree(cache, ignore_errors=True)
            for _ in range(args.resumes):
                shutil.rmtree(cache, ignore_errors=True)
                whole, after_state = astream_resume(remote, cache, total)
                resumes["astream"].append(whole)
                from_state["astream"].append(after_state)
                shutil.rmtree(cache, ignore_errors=True)
                for step, seconds in resume_floor(data, cache, total).items():
                    floors.setdefault(step, []).append(seconds)
            if args.hf_python:
                hf = hf_pass(args.hf_python, hf_files, args.resumes)
                assert hf["rows"] == total
                results["hf"].append(total / hf["seconds"])
                firsts["hf"].append(hf["first"])
                resumes["hf"].extend(hf["resume"])
                hf_wrong += hf["wrong"]
                from_state["hf"].extend(hf["from_state"])
            if args.lit_python:
                lit = lit_pass(args.lit_python, data, work, total, args.resumes)
                assert lit["rows"] == lit["warm_rows"] == total
                results["lit cold"].append(total / lit["cold"])
                results["lit warm"].append(total / lit["warm"])
                firsts["lit"].append(lit["first"])
                resumes["lit"].extend(lit["resume"])
                from_state["lit"].extend(lit["from_state"])
                lit_index.append(lit["index"])
            print(f"run {run}: " + ", ".join(f"{k} {v[-1]:,.0f} rows/s" for k, v in results.items() if v))
    finally:
        if server is not None:
            server.terminate()
            server.wait(10)
        shutil.rmtree(work, ignore_errors=True)
    print(f"load average at end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    if not args.resume_only:
        report_passes(results, firsts, lit_index if args.lit_python else [])
    n = len(resumes["astream"])
    print(f"resume at 90% to the first batch in hand (cold, {n} per side): median (quartiles; min-max) ms")
    for label, table in (("from construction", resumes), ("from load_state_dict", from_state)):
        print(f"  {label}: " + "; ".join(f"{k} {spread(v)}" for k, v in table.items()))
    if args.hf_python:
        print(f"  HF resumed at another row than its state's in {hf_wrong} of {len(resumes['hf'])}")
    print("resume floor (the steps alone, no agent or engine), medians: " + ", ".join(
        f"{k} {statistics.median(v) * 1e3:.1f} ms" for k, v in floors.items()))
    peers = [k for k in ("hf", "lit") if k in resumes]
    for label, table in (("from construction", resumes), ("from load_state_dict", from_state)):
        mine = statistics.median(table["astream"])
        line = f"resume {label}: astream median {mine * 1e3:.1f} ms"
        if firsts["cold"]:
            line += f", / its first batch = {mine / statistics.median(firsts['cold']):.2f}x"
        if peers:
            line += f", / fastest peer = {mine / min(statistics.median(table[k]) for k in peers):.2f}x"
        print(line)


def spread(seconds: list[float]) -> str:
    """``median (p25-p75; min-max)`` in ms."""
    ms = sorted(x * 1e3 for x in seconds)
    q = statistics.quantiles(ms, n=4, method="inclusive") if len(ms) > 1 else [ms[0]] * 3
    return f"{q[1]:.1f} ({q[0]:.1f}-{q[2]:.1f}; {ms[0]:.1f}-{ms[-1]:.1f})"


def report_passes(results: dict[str, list[float]], firsts: dict[str, list[float]], lit_index: list[float]) -> None:
    """The passes' medians (rows/s) and ratios, and the first batches."""
    med = {k: statistics.median(v) for k, v in results.items()}
    print("medians: " + ", ".join(f"{k} {v:,.0f} rows/s" for k, v in med.items()))
    print(f"astream warm / floor = {med['warm'] / med['floor']:.2f}x, cold / floor = {med['cold'] / med['floor']:.2f}x")
    print("first batch (cold, from constructing the dataset): " + ", ".join(
        f"{k} {statistics.median(v) * 1e3:.0f} ms" for k, v in firsts.items()))
    if "hf" in med:
        print(f"astream warm / hf = {med['warm'] / med['hf']:.2f}x, cold / hf = {med['cold'] / med['hf']:.2f}x")
    if "lit warm" in med:
        print(f"astream warm / lit warm = {med['warm'] / med['lit warm']:.2f}x, cold / lit cold = "
              f"{med['cold'] / med['lit cold']:.2f}x (lit's index_parquet_dataset: "
              f"{statistics.median(lit_index) * 1e3:.0f} ms, not in its cold pass)")


if __name__ == "__main__":
    main()
