"""Spark conversion side by side: astream's ``dataframe_to_mds`` and mosaicml-streaming's on one session.

Turn about on one Spark session (``local[--workers]``), on one input of ``--text-mb`` of ~1 KB
text/int rows and ``--array-mb`` of ~100 KB rows of one float32 array (25,000 values, 1-D:
MosaicML's converter refuses nested arrays), both to moto's S3 server, with the same columns,
compression and ``size_limit``: wall time, the CPU of every process, the peak disk of the
workers' staging folders (astream's tasks stage under their TMPDIR, MosaicML's under the
``(local, remote)`` pair's local folder, both inside one sampled folder) and the driver's
memory. ``--floor`` also times the floor (Spark's read alone, + zstd + write, + upload).
The interpreter must import both ``astream`` and ``streaming`` (with torch); the Spark
workers run the same one::

    PYTHONPATH=$PWD:.venv/lib/python3.11/site-packages <peer venv>/bin/python \
        benchmarks/convert_spark_bench.py --text-mb 512 --array-mb 512 --runs 1
"""

from __future__ import annotations

import concurrent.futures
import json
import os
import re
import shutil
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from _harness import Bench, parser

from astream.cli._harness.watch import FolderPeak, RssPeak
from astream.cli._harness.work import stub_streaming_vision, tree_cpu_s

HOST = "127.0.0.1"


def rows_of(folder: Path) -> int:
    return sum(pq.ParquetFile(f).metadata.num_rows for f in folder.glob("*.parquet"))


def parse_size(text: str) -> int:
    """``8mb`` -> bytes (powers of 1024, as MDS size limits are)."""
    found = re.fullmatch(r"(\d+)\s*([kmg]?)b?", text.strip().lower())
    if found is None:
        raise SystemExit(f"--size-limit {text!r}: give bytes, or a number with kb, mb or gb")
    return int(found.group(1)) << {"": 0, "k": 10, "m": 20, "g": 30}[found.group(2)]


def make_mixed_input(root: Path, text_mb: int, array_mb: int, files: int) -> tuple[Path, Path]:
    """~1 KB text/int rows and ~100 KB rows of a 1-D float32 array, ``files`` Parquet files each."""
    rng = np.random.default_rng(0)
    words = np.array(["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta"])
    text_dir, array_dir = root / "mixed-text", root / "mixed-arrays"
    text_dir.mkdir(), array_dir.mkdir()
    n = text_mb * 1024 // files
    for k in range(files):
        text = [" ".join(rng.choice(words, 150)) for _ in range(n)]
        pq.write_table(pa.table({"id": np.arange(k * n, (k + 1) * n), "label": rng.integers(0, 1000, n, dtype=np.int32),
                                 "text": text}), text_dir / f"{k}.parquet", row_group_size=4096)
    m = array_mb * 10 // files
    for k in range(files):
        flat = rng.standard_normal(m * 25_000).astype(np.float32)
        pq.write_table(pa.table({"id": np.arange(k * m, (k + 1) * m),
                                 "x": pa.ListArray.from_arrays(np.arange(0, m * 25_000 + 1, 25_000, dtype=np.int32),
                                                               pa.array(flat))}),
                       array_dir / f"{k}.parquet", row_group_size=64)
    return text_dir, array_dir


def floor_noop(batches: Any) -> Any:
    """The floor's first part: Spark reads the Parquet and hands the Python task its Arrow batches."""
    rows = sum(batch.num_rows for batch in batches)
    yield pa.RecordBatch.from_pydict({"n": [rows]})


def floor_task(endpoint: str | None, level: int, size_limit: int) -> Callable[[Any], Any]:
    """The floor with the work every converter must do: zstd of the batches' bytes, written, uploaded.

    The Arrow buffers of each batch (the values and offsets a shard holds) are gathered to
    ``size_limit``, compressed at ``level`` on one thread, written to a file and, with an
    ``endpoint``, PUT to moto's S3 (botocore, as both libraries' uploads) and deleted.
    """
    def task(batches: Any) -> Any:
        import uuid

        import zstandard

        compressor = zstandard.ZstdCompressor(level=level, write_content_size=True)
        client = None
        if endpoint:
            import botocore.session

            client = botocore.session.get_session().create_client(
                "s3", endpoint_url=endpoint, region_name="us-east-1", aws_access_key_id="testing",
                aws_secret_access_key="testing")
        folder = tempfile.mkdtemp(prefix="floor-")
        pending: list[bytes] = []
        size = rows = 0
        # One upload in flight while the next shard is gathered (as astream's tasks do).
        uploads = concurrent.futures.ThreadPoolExecutor(1)
        last: concurrent.futures.Future[None] | None = None

        def upload(path: str) -> None:
            assert client is not None
            with open(path, "rb") as fh:
                client.put_object(Bucket="bench", Key=f"floor/{os.path.basename(path)}", Body=fh.read())
            os.unlink(path)

        def flush() -> None:
            nonlocal size, last
            data = compressor.compress(b"".join(pending))
            path = os.path.join(folder, uuid.uuid4().hex)
            with open(path, "wb") as fh:
                fh.write(data)
            if last is not None:
                last.result()
            if client is not None:
                last = uploads.submit(upload, path)
            else:
                os.unlink(path)
            pending.clear()
            size = 0

        for batch in batches:
            rows += batch.num_rows
            for column in batch.columns:
                for buffer in column.buffers():
                    if buffer is not None:
                        pending.append(buffer.to_pybytes())
                        size += buffer.size
                        if size >= size_limit:
                            flush()
        if pending:
            flush()
        if last is not None:
            last.result()
        uploads.shutdown()
        os.rmdir(folder)
        yield pa.RecordBatch.from_pydict({"n": [rows]})

    return task


def side_by_side(args: Any, bench: Bench) -> None:
    """astream's and mosaicml-streaming's dataframe_to_mds on one Spark session, to moto S3."""
    import sys

    import psutil

    stub_streaming_vision()
    from streaming.base.converters import dataframe_to_mds as mosaic_to_mds  # type: ignore[import-not-found]

    from astream.convert import dataframe_to_mds as astream_to_mds
    from astream.testing import moto_s3

    root = Path(tempfile.mkdtemp(prefix="astream-convert-sbs-"))
    staging = root / "staging"  # every task's local shards, both libraries
    staging.mkdir()
    # Spark's Python workers unpickle MosaicML's task function, importing streaming: they need
    # the same stub, registered at start-up by a sitecustomize of their own.
    (root / "shim").mkdir()
    (root / "shim" / "sitecustomize.py").write_text(
        "import sys, types\nstub = types.ModuleType('streaming.vision')\nstub.__path__ = []\n"
        "sys.modules.setdefault('streaming.vision', stub)\n")
    os.environ["PYTHONPATH"] = os.pathsep.join(p for p in (str(root / "shim"), os.environ.get("PYTHONPATH")) if p)
    try:
        t0 = time.perf_counter()
        text_dir, array_dir = make_mixed_input(root, args.text_mb, args.array_mb, args.files)
        inputs = {"text": text_dir, "arrays": array_dir}
        size = sum(f.stat().st_size for d in inputs.values() for f in d.glob("*.parquet"))
        print(f"input: {size / 2**20:.0f} MiB of Parquet ({rows_of(text_dir):,} text rows, {rows_of(array_dir):,} "
              f"array rows; {args.files} files each), made in {time.perf_counter() - t0:.0f} s")
        columns = {"text": {"id": "int64", "label": "int32", "text": "str"},
                   "arrays": {"id": "int64", "x": "ndarray:float32"}}
        os.environ["TMPDIR"] = str(staging)  # the Python workers (new processes) stage astream's shards here
        os.environ["PYSPARK_PYTHON"] = sys.executable
        os.environ.setdefault("SPARK_LOCAL_IP", HOST)  # else Spark resolves the machine's own address
        with moto_s3("bench") as s3:
            from pyspark.sql import SparkSession

            start = time.perf_counter()
            spark = (SparkSession.builder.master(f"local[{args.workers}]").config("spark.driver.host", HOST)
                     .config("spark.driver.bindAddress", HOST).config("spark.ui.enabled", "false")
                     .config("spark.driver.memory", "4g").getOrCreate())
            spark.sparkContext.setLogLevel("ERROR")
            print(f"spark start-up {time.perf_counter() - start:.1f} s; master local[{args.workers}]")
            jvm = [p for p in psutil.Process().children(recursive=True) if "java" in p.name()][:1]
            from astream.convert.spark import files_to_mds

            limit = parse_size(args.size_limit)
            endpoint = os.environ["S3_ENDPOINT_URL"]
            floors = {
                "floor: read (mapInArrow, no-op)": floor_noop,
                "floor: read + zstd-3 + write": floor_task(None, 3, limit),
                "floor: read + zstd-3 + write + upload": floor_task(endpoint, 3, limit),
            }
            tools = {"astream": astream_to_mds, "mosaicml-streaming": mosaic_to_mds}
            if not args.no_files:
                tools["astream files_to_mds (tasks read the Parquet)"] = "files"
            rows: list[list[Any]] = []
            for name, folder in inputs.items():
                parts = spark.read.parquet(str(folder)).rdd.getNumPartitions()
                for tool, convert in tools.items():  # untimed: start every Python worker, import each library
                    if convert == "files":
                        small = root / f"warm-{name}"
                        small.mkdir()
                        first = sorted(folder.glob("*.parquet"))[0]
                        pq.write_table(pq.read_table(first).slice(0, 64), small / "0.parquet")
                        files_to_mds(spark, [str(small)], "parquet", {"out": str(staging / "warm"),
                                                                      "columns": columns[name]}, tasks=args.workers)
                        shutil.rmtree(staging / "warm", ignore_errors=True)
                        continue
                    warm = spark.read.parquet(str(folder)).limit(64).repartition(args.workers)
                    convert(warm, mds_kwargs={"out": (str(staging / "warm"), f"s3://bench/warm-{tool}-{name}"),
                                              "columns": columns[name], "compression": "zstd"})
                    shutil.rmtree(staging / "warm", ignore_errors=True)
                names = [*floors, *tools] if args.floor else list(tools)
                got: dict[str, dict[str, list[float]]] = {
                    t: {"wall": [], "cpu": [], "disk": [], "py": [], "jvm": []} for t in names}
                for r in range(args.runs):
                    for tool in names:
                        key = f"{abs(hash(tool))}-{name}-{r}"
                        out: Any = f"s3://bench/{key}"
                        if tool == "mosaicml-streaming":  # its driver stages in a mkdtemp of its own otherwise
                            out = (str(staging / key), out)
                        df = spark.read.parquet(str(folder))
                        kwargs = {"out": out, "columns": columns[name], "compression": "zstd",
                                  "size_limit": args.size_limit}
                        memory = RssPeak([psutil.Process(), *jvm])
                        with FolderPeak(staging) as disk, memory:
                            t, cpu = time.perf_counter(), tree_cpu_s()
                            if tool in floors:
                                df.mapInArrow(floors[tool], "n long").collect()
                            elif tools[tool] == "files":
                                files_to_mds(spark, [str(folder)], "parquet", kwargs, tasks=parts)
                            else:
                                tools[tool](df, mds_kwargs=kwargs)
                            got[tool]["wall"].append(time.perf_counter() - t)
                            got[tool]["cpu"].append(tree_cpu_s() - cpu)
                        got[tool]["disk"].append(disk.peak)
                        got[tool]["py"].append(memory.peaks[0])
                        got[tool]["jvm"].append(memory.peaks[1] if len(memory.peaks) > 1 else 0)
                        what = ""
                        if tool not in floors:
                            index = s3.get_object(Bucket="bench", Key=f"{key}/index.json")["Body"].read()
                            shards = json.loads(index)["shards"]
                            what = f", {len(shards)} shards, {sum(s['samples'] for s in shards):,} samples"
                        print(f"  {name} run {r} {tool}: {got[tool]['wall'][-1]:.1f} s, {got[tool]['cpu'][-1]:.1f} "
                              f"CPU s, peak staging disk {disk.peak / 2**20:.0f} MiB{what}; load "
                              f"{os.getloadavg()[0]:.1f}", flush=True)
                        shutil.rmtree(staging / key, ignore_errors=True)
                med = {t: {k: statistics.median(v) for k, v in g.items()} for t, g in got.items()}
                m = med["mosaicml-streaming"]
                for tool in names:
                    x = med[tool]
                    rows.append([name, parts, tool, f"{x['wall']:.1f}", f"{x['wall'] / m['wall']:.2f}x",
                                 f"{x['cpu']:.1f}", f"{x['cpu'] / m['cpu']:.2f}x", f"{x['disk'] / 2**20:.0f}",
                                 f"{x['disk'] / max(1, m['disk']):.3f}x", f"{x['py'] / 2**20:.0f}",
                                 f"{x['jvm'] / 2**20:.0f}"])
            spark.stop()
        bench.table(f"medians of {args.runs} runs, Spark local[{args.workers}], zstd, size_limit {args.size_limit}, "
                    f"out s3:// (moto); load at the end {os.getloadavg()[0]:.1f}",
                    ["input", "partitions", "run", "wall s", "wall / mosaic", "CPU s (all processes)",
                     "CPU / mosaic", "peak staging disk MiB", "disk / mosaic", "driver Python peak RSS MiB",
                     "Spark JVM peak RSS MiB"], rows)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main() -> None:
    p = parser(__doc__, "convert-spark", runs=1)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--text-mb", type=int, default=64)
    p.add_argument("--array-mb", type=int, default=128)
    p.add_argument("--size-limit", default="8mb")
    p.add_argument("--files", type=int, default=8, help="Parquet files of each input")
    p.add_argument("--floor", action="store_true", help="also time the floor (Spark's read alone, + zstd + write, "
                   "+ upload)")
    p.add_argument("--no-files", action="store_true", help="leave out astream's files_to_mds (its tasks read the "
                   "Parquet)")
    args = p.parse_args()
    side_by_side(args, Bench("convert-spark", args))


if __name__ == "__main__":
    main()
