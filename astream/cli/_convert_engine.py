"""``astream convert --engine dask|ray|spark``: the conversion on a distributed engine.

The engine reads the inputs itself (:func:`astream.convert.sources.read_files`) and writes a
part per partition with :mod:`astream.convert`; the merged index comes last. Without an
address in the environment each engine starts locally, bound to 127.0.0.1, with
``--workers`` processes: ``DASK_SCHEDULER_ADDRESS``, ``RAY_ADDRESS`` or ``SPARK_MASTER``
point it at a running cluster instead.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import time
from collections.abc import Iterator
from typing import Any

from astream._storage.local import local_path_of
from astream._storage.loop import run as run_loop
from astream.cli._infer import parse_column_overrides
from astream.cli._inputs import detect_format
from astream.cli._out import prepare_out
from astream.cli._output import CommandError, progress
from astream.cli._source import is_local
from astream.cli._upload import remote_has_index
from astream.convert.sources import ENGINE_FORMATS, IMAGE_EXTENSIONS

__all__ = ["ENGINES", "run_engine"]

ENGINES = ("local", "dask", "ray", "spark")
_LOOPBACK = "127.0.0.1"


def _format(args: argparse.Namespace) -> str:
    if args.format:
        fmt = str(args.format)
    elif not all(is_local(p) for p in args.inputs):
        fmt = _remote_format(args.inputs)
    else:
        names = [f for p in args.inputs for f in (os.listdir(p) if os.path.isdir(p) else [p])]
        if names and all(os.path.splitext(n)[1].lower() in IMAGE_EXTENSIONS for n in names):
            fmt = "image"
        else:
            fmt = detect_format(args.inputs)
    if fmt not in ENGINE_FORMATS:
        raise CommandError(f"--engine {args.engine} reads {', '.join(ENGINE_FORMATS)} inputs, not {fmt}; "
                           "use --engine local for it", 2)
    return fmt


def _remote_format(inputs: list[str]) -> str:
    """The one engine format whose files the remote inputs hold (listed with astream's storage)."""
    from astream.convert.files import list_inputs
    from astream.errors import ConfigError

    found = []
    for fmt in ENGINE_FORMATS:
        try:
            list_inputs(inputs, fmt)
        except ConfigError:
            continue
        found.append(fmt)
    if len(found) != 1:
        what = f"files of several formats ({', '.join(found)})" if found else "no parquet, jsonl or image files"
        raise CommandError(f"{', '.join(inputs)}: {what}; give --format ({', '.join(ENGINE_FORMATS)})", 2)
    return found[0]


@contextlib.contextmanager
def _engine(name: str, workers: int) -> Iterator[Any]:
    """The engine's handle (a SparkSession, the ray module, a dask Client), started and stopped here."""
    if name == "dask":
        import distributed

        dist: Any = distributed  # untyped
        address = os.environ.get("DASK_SCHEDULER_ADDRESS")
        if address:
            with dist.Client(address) as client:
                yield client
            return
        with dist.LocalCluster(n_workers=workers, threads_per_worker=1, processes=True, host=_LOOPBACK,
                               dashboard_address=None) as cluster, dist.Client(cluster) as client:
            yield client
        return
    if name == "ray":
        import ray

        if ray.is_initialized():  # the caller's Ray: use it, leave it running
            yield ray
            return
        if os.environ.get("RAY_ADDRESS"):
            ray.init(address=os.environ["RAY_ADDRESS"])
        else:
            ray.init(num_cpus=workers, include_dashboard=False, _node_ip_address=_LOOPBACK)
        try:
            yield ray
        finally:
            ray.shutdown()
        return
    from pyspark.sql import SparkSession

    active = SparkSession.getActiveSession()
    if active is not None:  # the caller's session: use it, leave it running
        yield active
        return
    master = os.environ.get("SPARK_MASTER") or f"local[{workers},2]"
    builder = SparkSession.builder.master(master).appName("astream-convert").config("spark.ui.enabled", "false")
    if master.startswith("local"):
        builder = builder.config("spark.driver.host", _LOOPBACK).config("spark.driver.bindAddress", _LOOPBACK)
    session = builder.getOrCreate()
    try:
        yield session
    finally:
        session.stop()


def _check_out(out: str, overwrite: bool, inputs: list[str]) -> None:
    if is_local(out):
        prepare_out(local_path_of(out), overwrite, inputs)
    elif run_loop(remote_has_index(out)) and not overwrite:
        raise CommandError(f"--out {out}: already holds a dataset; pass --overwrite to replace it", 2)


def run_engine(args: argparse.Namespace) -> int:
    """Convert on ``args.engine``; exit code 0 on success."""
    overrides = parse_column_overrides(args.columns or [])
    fmt = _format(args)
    workers = args.workers or max(1, min(os.cpu_count() or 1, 8))
    _check_out(args.out, args.overwrite, args.inputs)
    out = local_path_of(args.out) if is_local(args.out) else args.out
    writer: dict[str, Any] = {"size_limit": args.size_limit}
    if args.compression:
        writer["compression"] = args.compression
    hashes = [h.strip() for h in (args.hashes or "").split(",") if h.strip()]
    if hashes:
        writer["hashes"] = hashes
    quiet = bool(getattr(args, "quiet", False))
    start = time.perf_counter()
    with _engine(args.engine, workers) as handle:
        from astream.convert.sources import read_files

        if args.engine == "spark" and not all(is_local(p) for p in args.inputs):
            samples = _spark_files(handle, args.inputs, fmt, out, overrides, writer, args.parts, quiet)
        else:
            data = read_files(args.engine, args.inputs, fmt, handle if args.engine == "spark" else None)
            samples = _run(args.engine, data, out, overrides, writer, args.parts, quiet)
    if not quiet:
        print(f"wrote {samples:,} samples to {args.out} with {args.engine} in {time.perf_counter() - start:.1f} s")
    return 0


def _run(engine: str, data: Any, out: str, columns: dict[str, str], writer: dict[str, Any], parts: int | None,
         quiet: bool) -> int:
    if engine == "dask":
        from astream.convert.dask import to_mds

        if parts:
            data = data.repartition(npartitions=parts)
        with progress(quiet, total=data.npartitions, unit="parts", desc="convert") as bar:
            fragments = to_mds(data, out, columns or None, progress=lambda f: bar.update(1), **writer)
        return sum(f.samples for f in fragments)
    if engine == "ray":
        from astream.convert.ray import MDSDatasink

        if parts:
            data = data.repartition(parts)
        sink = MDSDatasink(out, columns or None, **writer)
        data.write_datasink(sink)
        return sum(f.samples for f in sink.fragments)
    from astream.convert.spark import dataframe_to_mds

    if parts:
        data = data.repartition(parts)
    with progress(quiet, total=1, unit="jobs", desc="convert") as bar:
        dataframe_to_mds(data, mds_kwargs={"out": out, **({"columns": columns} if columns else {}), **writer})
        bar.update(1)
    from astream.convert._part import split_out

    local, remote = split_out(out)
    return _count(local, remote)


def _spark_files(session: Any, inputs: list[str], fmt: str, out: str, columns: dict[str, str],
                 writer: dict[str, Any], parts: int | None, quiet: bool) -> int:
    """Remote inputs on Spark: listed and read by the tasks through astream's storage.

    Spark's own readers need the Hadoop connector jars for ``s3a://`` or ``gs://`` (from
    Maven, configured by the user); this path needs nothing beyond astream.
    """
    from astream.convert._part import split_out
    from astream.convert.spark import files_to_mds

    with progress(quiet, total=1, unit="jobs", desc="convert") as bar:
        files_to_mds(session, inputs, fmt, {"out": out, **({"columns": columns} if columns else {}), **writer},
                     tasks=parts or None)
        bar.update(1)
    local, remote = split_out(out)
    return _count(local, remote)


def _count(local: str | None, remote: str | None) -> int:
    from astream._format.index import INDEX_NAME, Index
    from astream._storage.registry import StoragePool, join_url

    root = remote or local
    assert root is not None
    url = join_url(root, INDEX_NAME)

    async def read() -> bytes:
        async with StoragePool() as pool:
            return await pool.get(url).read_bytes(url)

    return Index.from_bytes(run_loop(read()), url).num_samples
