"""Distributed conversion: Parquet -> zstd MDS on Spark, Ray Data and Dask against the local CLI.

Two inputs are generated once (``--text-mb`` of ~1 KB text/int rows, ``--array-mb`` of
~100 KB float32 arrays of shape 100x250). For each, every engine converts the same files
``--runs`` times into a fresh folder; the table gives the median wall time and rows/s, and
the ratio against ``astream convert --engine local`` with the same number of workers.
Engines are started once, before the timed runs (their start-up is reported apart); the
local CLI's own worker processes start inside each run, as they do for a user. Spark also
writes to moto's S3 server on 127.0.0.1, with the peak disk its tasks use (the staging
folders under the workers' TMPDIR) and the driver's peak memory (Python's and the JVM's).
``convert_spark_bench.py`` runs astream's and mosaicml-streaming's converters side by side.

Ray listens on every interface, so run the whole script in a loopback-only namespace::

    unshare -n sh -c 'ip link set lo up && python benchmarks/convert_bench.py --runs 3'
"""

from __future__ import annotations

import json
import os
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

HOST = "127.0.0.1"


def rows_of(folder: Path) -> int:
    return sum(pq.ParquetFile(f).metadata.num_rows for f in folder.glob("*.parquet"))


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
    parser_ = parser(__doc__, "convert")
    parser_.add_argument("--workers", type=int, default=2)
    parser_.add_argument("--text-mb", type=int, default=64)
    parser_.add_argument("--array-mb", type=int, default=128)
    parser_.add_argument("--engines", default="local,dask,ray,spark")
    parser_.add_argument("--size-limit", default="8mb")
    parser_.add_argument("--merge-parts", type=int, default=10_000, help="parts of the synthetic merge (0: skip)")
    parser_.add_argument("--shards-per-part", type=int, default=15)
    args = parser_.parse_args()
    bench = Bench("convert", args)
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
        report(bench, args, inputs, results, spark_notes)
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
        memory = RssPeak([psutil.Process(), *jvm[:1]])
        for name, folder in inputs.items():
            def run_local(out: str, f: Path = folder) -> None:
                df = spark.read.parquet(str(f)).repartition(2 * args.workers)
                dataframe_to_mds(df, mds_kwargs={"out": out, "compression": "zstd", "size_limit": args.size_limit})
            results[name]["spark"] = statistics.median(timed(args.runs, run_local, root))
            times, peaks = [], []
            for r in range(args.runs):
                url = f"s3://bench/{abs(hash(name))}-{r}"
                df = spark.read.parquet(str(folder)).repartition(2 * args.workers)
                with FolderPeak(worker_tmp) as disk, memory:
                    t0 = time.perf_counter()
                    dataframe_to_mds(df, mds_kwargs={"out": url, "compression": "zstd", "size_limit": args.size_limit})
                    times.append(time.perf_counter() - t0)
                peaks.append(disk.peak)
                key = url[len("s3://bench/"):] + "/index.json"
                shards = json.loads(s3.get_object(Bucket="bench", Key=key)["Body"].read())["shards"]
            results[name]["spark→S3"] = statistics.median(times)
            largest = max((s.get("zip_data") or s["raw_data"])["bytes"] for s in shards)
            notes.append(f"{name}: peak disk of all tasks under the workers' TMPDIR {max(peaks) / 2**20:.1f} MiB "
                         f"({2 * args.workers} tasks, {args.workers} at a time; largest shard {largest / 2**20:.1f} MiB, "
                         f"{len(shards)} shards)")
        py_peak = memory.peaks[0] / 2**20
        jvm_peak = (memory.peaks[1] if len(memory.peaks) > 1 else 0) / 2**20
        notes.append(f"driver memory during the S3 conversions: Python driver peak RSS {py_peak:.0f} MiB "
                     f"({driver_rss / 2**20:.0f} MiB before them, after generating the inputs); Spark JVM "
                     f"(driver and local executors in one process) peak RSS {jvm_peak:.0f} MiB")
        spark.stop()
    return notes


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


def report(bench: Bench, args: Any, inputs: dict[str, Path], results: dict[str, dict[str, float]],
           notes: list[str]) -> None:
    rows = []
    for name, folder in inputs.items():
        count, base = rows_of(folder), results[name].get("local")
        for engine, seconds in results[name].items():
            rows.append([name, f"{count:,}", engine, f"{seconds:.2f}", f"{count / seconds:,.0f}",
                         f"{base / seconds:.2f}x" if base else "-"])
    bench.table(f"medians of {args.runs} runs, {args.workers} workers, zstd, size_limit {args.size_limit}, "
                f"load {os.getloadavg()[0]:.1f}", ["input", "rows", "engine", "wall s", "rows/s", "vs local"], rows)
    for note in notes:
        print(f"- {note}")


if __name__ == "__main__":
    main()
