"""Distributed conversion: Parquet -> zstd MDS on Spark, Ray Data and Dask against the local CLI.

Two inputs are generated once (``--text-mb`` of ~1 KB text/int rows, ``--array-mb`` of
~100 KB float32 arrays of shape 100x250). For each, every engine converts the same files
``--runs`` times into a fresh folder; the table gives the median wall time and rows/s, and
the ratio against ``astream convert --engine local`` with the same number of workers.
Engines are started once, before the timed runs (their start-up is reported apart);
the local CLI's own worker processes start inside each run, as they do for a user.

Spark also writes to moto's S3 server on 127.0.0.1, with the peak disk its tasks use
(the staging folders under the workers' TMPDIR, sampled every 5 ms) and the driver's
peak memory (the Python driver's RSS and the JVM's).

Ray listens on every interface, so run the whole script in a loopback-only namespace::

    unshare -n sh -c 'ip link set lo up && .venv/bin/python benchmarks/convert_bench.py --runs 3'

``--side-by-side`` instead runs astream's ``dataframe_to_mds`` and mosaicml-streaming's on
the same Spark session, turn about, on one input of ``--text-mb`` of ~1 KB text/int rows and
``--array-mb`` of ~100 KB rows of one float32 array (25,000 values, 1-D: MosaicML's
converter refuses nested arrays), both to moto's S3 server, with the same columns,
compression and ``size_limit``: wall time, the peak disk of the workers' staging folders
(astream's tasks stage under their TMPDIR, MosaicML's under the ``(local, remote)`` pair's
local folder, both inside one sampled folder) and the driver's memory. The interpreter must
import both ``astream`` and ``streaming`` (with torch); the Spark workers run the same one::

    PYTHONPATH=$PWD:.venv/lib/python3.11/site-packages <peer venv>/bin/python \
        benchmarks/convert_bench.py --side-by-side --text-mb 512 --array-mb 512 --runs 1
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import os
import shutil
import statistics
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from peer_stub import stub_streaming_vision

from astream._format.index import Index

HOST = "127.0.0.1"


def make_inputs(root: Path, text_mb: int, array_mb: int) -> dict[str, Path]:
    rng = np.random.default_rng(0)
    words = np.array(["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta"])
    text_dir, array_dir = root / "text", root / "arrays"
    text_dir.mkdir(), array_dir.mkdir()
    rows = text_mb * 1024
    for k in range(4):
        n = rows // 4
        text = [" ".join(rng.choice(words, 150)) for _ in range(n)]
        pq.write_table(pa.table({"id": np.arange(k * n, (k + 1) * n), "label": rng.integers(0, 1000, n, dtype=np.int32),
                                 "text": text}), text_dir / f"{k}.parquet", row_group_size=4096)
    arrays = array_mb * 10
    for k in range(4):
        n = arrays // 4
        flat = rng.standard_normal(n * 25_000).astype(np.float32)
        grid = pa.FixedSizeListArray.from_arrays(pa.FixedSizeListArray.from_arrays(pa.array(flat), 250), 100)
        pq.write_table(pa.table({"id": np.arange(k * n, (k + 1) * n), "x": grid}), array_dir / f"{k}.parquet",
                       row_group_size=64)
    return {"text (~1 KB rows)": text_dir, "arrays (~100 KB rows)": array_dir}


def rows_of(folder: Path) -> int:
    return sum(pq.ParquetFile(f).metadata.num_rows for f in folder.glob("*.parquet"))


class MemoryPeak:
    """The largest RSS of each process in ``processes`` seen while running (sampled every 10 ms)."""

    def __init__(self, processes: list[Any]) -> None:
        self.processes, self.peaks = processes, [0] * len(processes)
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _run(self) -> None:
        while not self._stop.is_set():
            for k, p in enumerate(self.processes):
                with contextlib.suppress(Exception):
                    self.peaks[k] = max(self.peaks[k], p.memory_info().rss)
            time.sleep(0.01)

    def __enter__(self) -> MemoryPeak:  # re-entered once per run; the peaks accumulate
        self._stop.clear()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        assert self._thread is not None
        self._thread.join()


class DiskPeak:
    """The largest total size of the files under ``folder`` seen while running."""

    def __init__(self, folder: Path) -> None:
        self.folder, self.peak, self._stop = folder, 0, threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            total = 0
            for here, _, names in os.walk(self.folder):
                for name in names:
                    with contextlib.suppress(OSError):
                        total += os.path.getsize(os.path.join(here, name))
            self.peak = max(self.peak, total)
            time.sleep(0.005)

    def __enter__(self) -> DiskPeak:
        self._thread.start()
        return self

    def __exit__(self, *exc: Any) -> None:
        self._stop.set()
        self._thread.join()


def timed(runs: int, fn: Callable[[str], None], scratch: Path) -> list[float]:
    times = []
    for r in range(runs):
        out = scratch / f"out-{r}"
        shutil.rmtree(out, ignore_errors=True)
        start = time.perf_counter()
        fn(str(out))
        times.append(time.perf_counter() - start)
        shutil.rmtree(out, ignore_errors=True)
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--text-mb", type=int, default=64)
    parser.add_argument("--array-mb", type=int, default=128)
    parser.add_argument("--engines", default="local,dask,ray,spark")
    parser.add_argument("--size-limit", default="8mb")
    parser.add_argument("--merge-parts", type=int, default=10_000, help="parts of the synthetic merge (0: skip)")
    parser.add_argument("--shards-per-part", type=int, default=15)
    parser.add_argument("--side-by-side", action="store_true",
                        help="astream's and mosaicml-streaming's dataframe_to_mds on one Spark session")
    parser.add_argument("--files", type=int, default=8, help="Parquet files of each input (--side-by-side)")
    parser.add_argument("--floor", action="store_true",
                        help="--side-by-side: also time the floor (Spark's read alone, + zstd + write, + upload)")
    parser.add_argument("--no-files", action="store_true",
                        help="--side-by-side: leave out astream's files_to_mds (its tasks read the Parquet)")
    args = parser.parse_args()
    if args.side_by_side:
        side_by_side(args)
        return
    engines = args.engines.split(",")
    root = Path(tempfile.mkdtemp(prefix="astream-convert-bench-"))
    worker_tmp = root / "worker-tmp"
    worker_tmp.mkdir()
    try:
        inputs = make_inputs(root, args.text_mb, args.array_mb)
        results: dict[str, dict[str, float]] = {name: {} for name in inputs}
        common = ["--compression", "zstd", "--size-limit", args.size_limit, "-q"]
        from astream.cli import main as cli

        if "local" in engines:
            for name, folder in inputs.items():
                t = timed(args.runs, lambda out, f=folder: cli(["convert", str(f), "-o", out, "--workers",
                                                                  str(args.workers), *common]), root)
                results[name]["local"] = statistics.median(t)
        if "dask" in engines:
            import dask.dataframe as dd
            from distributed import Client, LocalCluster

            from astream.convert.dask import to_mds

            start = time.perf_counter()
            with LocalCluster(n_workers=args.workers, threads_per_worker=1, host=HOST, dashboard_address=None) as cl, \
                    Client(cl):
                print(f"dask start-up {time.perf_counter() - start:.1f} s")
                for name, folder in inputs.items():
                    def run_dask(out: str, f: Path = folder) -> None:
                        ddf = dd.read_parquet(str(f), dtype_backend="pyarrow")
                        to_mds(ddf.repartition(npartitions=2 * args.workers), out, compression="zstd",
                               size_limit=args.size_limit)
                    results[name]["dask"] = statistics.median(timed(args.runs, run_dask, root))
        if "ray" in engines:
            import ray
            import ray.data

            from astream.convert.ray import MDSDatasink

            start = time.perf_counter()
            ray.init(num_cpus=args.workers, include_dashboard=False, _node_ip_address=HOST, log_to_driver=False)
            ray.data.DataContext.get_current().enable_progress_bars = False
            print(f"ray start-up {time.perf_counter() - start:.1f} s")
            class NullSink(ray.data.Datasink):  # type: ignore[type-arg]
                """Reads every block and writes nothing: what a Ray Data write job costs by itself."""

                def write(self, blocks: Any, ctx: Any) -> None:
                    for _ in blocks:
                        pass

            for name, folder in inputs.items():
                def run_ray(out: str, f: Path = folder) -> None:
                    ray.data.read_parquet(str(f)).write_datasink(
                        MDSDatasink(out, compression="zstd", size_limit=args.size_limit))

                def run_null(out: str, f: Path = folder) -> None:
                    ray.data.read_parquet(str(f)).write_datasink(NullSink())
                results[name]["ray"] = statistics.median(timed(args.runs, run_ray, root))
                results[name]["ray, no-op sink"] = statistics.median(timed(args.runs, run_null, root))
                print(f"{name}: Ray Data read {ray.data.read_parquet(str(folder)).materialize().num_blocks()} "
                      "block(s), so that many write tasks")
            ray.shutdown()
        spark_notes = run_spark(args, inputs, results, root, worker_tmp) if "spark" in engines else []
        if args.merge_parts:
            spark_notes.append(merge_cost(root, args.merge_parts, args.shards_per_part))
        report(args, inputs, results, spark_notes)
    finally:
        shutil.rmtree(root, ignore_errors=True)


def run_spark(args: Any, inputs: dict[str, Path], results: dict[str, dict[str, float]], root: Path,
              worker_tmp: Path) -> list[str]:
    import sys

    import psutil

    from astream.convert import dataframe_to_mds
    from astream.testing import moto_s3

    notes: list[str] = []
    os.environ["TMPDIR"] = str(worker_tmp)  # Spark's Python workers stage remote shards here
    with moto_s3("bench") as s3:
        os.environ["PYSPARK_PYTHON"] = sys.executable
        from pyspark.sql import SparkSession

        start = time.perf_counter()
        spark = (SparkSession.builder.master(f"local[{args.workers}]").config("spark.driver.host", HOST)
                 .config("spark.driver.bindAddress", HOST).config("spark.ui.enabled", "false").getOrCreate())
        spark.sparkContext.setLogLevel("ERROR")
        print(f"spark start-up {time.perf_counter() - start:.1f} s")
        jvm = [p for p in psutil.Process().children(recursive=True) if "java" in p.name()]
        driver_rss = psutil.Process().memory_info().rss
        memory = MemoryPeak([psutil.Process(), *jvm[:1]])
        for name, folder in inputs.items():
            def run_local(out: str, f: Path = folder) -> None:
                df = spark.read.parquet(str(f)).repartition(2 * args.workers)
                dataframe_to_mds(df, mds_kwargs={"out": out, "compression": "zstd", "size_limit": args.size_limit})
            results[name]["spark"] = statistics.median(timed(args.runs, run_local, root))
            times, peaks = [], []
            for r in range(args.runs):
                url = f"s3://bench/{abs(hash(name))}-{r}"
                df = spark.read.parquet(str(folder)).repartition(2 * args.workers)
                with DiskPeak(worker_tmp) as disk, memory:
                    t0 = time.perf_counter()
                    dataframe_to_mds(df, mds_kwargs={"out": url, "compression": "zstd", "size_limit": args.size_limit})
                    times.append(time.perf_counter() - t0)
                peaks.append(disk.peak)
                index = Index.from_bytes(s3.get_object(Bucket="bench", Key=url[len("s3://bench/"):] + "/index.json")["Body"].read())
            results[name]["spark→S3"] = statistics.median(times)
            largest = max(s.stored.bytes for s in index.shards)
            notes.append(f"{name}: peak disk of all tasks under the workers' TMPDIR {max(peaks) / 2**20:.1f} MiB "
                         f"({2 * args.workers} tasks, {args.workers} at a time; largest shard {largest / 2**20:.1f} MiB, "
                         f"{len(index.shards)} shards)")
        py_peak = memory.peaks[0] / 2**20
        jvm_peak = (memory.peaks[1] if len(memory.peaks) > 1 else 0) / 2**20
        notes.append(f"driver memory during the S3 conversions: Python driver peak RSS {py_peak:.0f} MiB "
                     f"({driver_rss / 2**20:.0f} MiB before them, after generating the inputs); Spark JVM "
                     f"(driver and local executors in one process) peak RSS {jvm_peak:.0f} MiB")
        spark.stop()
    return notes


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


def tree_cpu() -> dict[int, float]:
    """CPU seconds of this process and every descendant (the JVM, its Python workers), by pid."""
    import psutil

    seconds = {}
    me = psutil.Process()
    for proc in [me, *me.children(recursive=True)]:
        with contextlib.suppress(Exception):
            t = proc.cpu_times()
            seconds[proc.pid] = t.user + t.system + t.children_user + t.children_system
    return seconds


def cpu_since(before: dict[int, float]) -> float:
    """CPU seconds the process tree used since ``before`` (a process gone since is left out)."""
    return sum(cpu - before.get(pid, 0.0) for pid, cpu in tree_cpu().items())


def side_by_side(args: Any) -> None:
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
            from astream._units import parse_bytes
            from astream.convert.spark import files_to_mds

            limit = parse_bytes(args.size_limit, "size_limit")
            endpoint = os.environ["S3_ENDPOINT_URL"]
            floors = {
                "floor: read (mapInArrow, no-op)": floor_noop,
                "floor: read + zstd-3 + write": floor_task(None, 3, limit),
                "floor: read + zstd-3 + write + upload": floor_task(endpoint, 3, limit),
            }
            tools = {"astream": astream_to_mds, "mosaicml-streaming": mosaic_to_mds}
            if not args.no_files:
                tools["astream files_to_mds (tasks read the Parquet)"] = "files"
            rows: list[str] = []
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
                        memory = MemoryPeak([psutil.Process(), *jvm])
                        with DiskPeak(staging) as disk, memory:
                            t, cpu = time.perf_counter(), tree_cpu()
                            if tool in floors:
                                df.mapInArrow(floors[tool], "n long").collect()
                            elif tools[tool] == "files":
                                files_to_mds(spark, [str(folder)], "parquet", kwargs, tasks=parts)
                            else:
                                tools[tool](df, mds_kwargs=kwargs)
                            got[tool]["wall"].append(time.perf_counter() - t)
                            got[tool]["cpu"].append(cpu_since(cpu))
                        got[tool]["disk"].append(disk.peak)
                        got[tool]["py"].append(memory.peaks[0])
                        got[tool]["jvm"].append(memory.peaks[1] if len(memory.peaks) > 1 else 0)
                        what = ""
                        if tool not in floors:
                            index = s3.get_object(Bucket="bench", Key=f"{key}/index.json")["Body"].read()
                            merged = Index.from_bytes(index)
                            what = f", {len(merged.shards)} shards, {merged.num_samples:,} samples"
                        print(f"  {name} run {r} {tool}: {got[tool]['wall'][-1]:.1f} s, {got[tool]['cpu'][-1]:.1f} "
                              f"CPU s, peak staging disk {disk.peak / 2**20:.0f} MiB{what}; load "
                              f"{os.getloadavg()[0]:.1f}", flush=True)
                        shutil.rmtree(staging / key, ignore_errors=True)
                med = {t: {k: statistics.median(v) for k, v in g.items()} for t, g in got.items()}
                m = med["mosaicml-streaming"]
                for tool in names:
                    x = med[tool]
                    rows.append(f"| {name} | {parts} | {tool} | {x['wall']:.1f} | **{x['wall'] / m['wall']:.2f}x** | "
                                f"{x['cpu']:.1f} | {x['cpu'] / m['cpu']:.2f}x | {x['disk'] / 2**20:.0f} | "
                                f"{x['disk'] / max(1, m['disk']):.3f}x | {x['py'] / 2**20:.0f} | {x['jvm'] / 2**20:.0f} |")
            spark.stop()
        print(f"\nmedian of {args.runs} runs, Spark local[{args.workers}], zstd, size_limit {args.size_limit}, "
              f"out s3:// (moto); load at the end {os.getloadavg()}\n")
        print("| input | partitions | run | wall s | wall / mosaic | CPU s (all processes) | CPU / mosaic "
              "| peak staging disk MiB | disk / mosaic | driver Python peak RSS MiB | Spark JVM peak RSS MiB |")
        print("|---|---:|---|---:|---:|---:|---:|---:|---:|---:|---:|")
        print("\n".join(rows))
    finally:
        shutil.rmtree(root, ignore_errors=True)


def merge_cost(root: Path, parts: int, per_part: int) -> str:
    """Time merge_index over ``parts`` fragments of ``per_part`` shards (5 columns, zstd, xxh64)."""
    import dataclasses

    from astream.convert import merge_index, write_partition

    one = write_partition(pa.table({"id": [1], "label": [2], "text": ["x"], "x": [[1.0]], "y": [b"z"]}),
                          str(root / "merge-src"), 0, compression="zstd", hashes=["xxh64"])
    shard = dict(one.shards[0])
    fragments = []
    for p in range(parts):
        shards = tuple({**shard, "raw_data": {**shard["raw_data"], "basename": f"shard.{k:05d}.mds"},
                        "zip_data": {**shard["zip_data"], "basename": f"shard.{k:05d}.mds.zstd"}}
                       for k in range(per_part))
        fragments.append(dataclasses.replace(one, partition_id=p, shards=shards, local=str(root / "merged")))
    start = time.perf_counter()
    path = merge_index(fragments)
    seconds = time.perf_counter() - start
    size = os.path.getsize(path)
    return (f"merge_index of {parts:,} fragments x {per_part} shards ({parts * per_part:,} entries): "
            f"{seconds:.1f} s on the driver, index.json {size / 2**20:.0f} MiB ({size / (parts * per_part):.0f} B a shard)")


def report(args: Any, inputs: dict[str, Path], results: dict[str, dict[str, float]], notes: list[str]) -> None:
    print(f"\nmedian of {args.runs} runs, {args.workers} workers, zstd, size_limit {args.size_limit}\n")
    print("| input | rows | engine | wall s | rows/s | vs local |")
    print("|---|---:|---|---:|---:|---:|")
    for name, folder in inputs.items():
        rows = rows_of(folder)
        base = results[name].get("local")
        for engine, seconds in results[name].items():
            ratio = f"{base / seconds:.2f}x" if base else "-"
            print(f"| {name} | {rows:,} | {engine} | {seconds:.2f} | {rows / seconds:,.0f} | {ratio} |")
    for note in notes:
        print(f"- {note}")


if __name__ == "__main__":
    main()
