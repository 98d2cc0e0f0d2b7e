"""Spark: ``dataframe_to_mds``, MosaicML's function with its signature and meaning.

A Databricks notebook changes only its import::

    from astream.convert import dataframe_to_mds   # was: from streaming.base.converters import ...
    dataframe_to_mds(df.repartition(8), merge_index=True,
                     mds_kwargs={"out": "s3://bucket/ds", "columns": {...}, "compression": "zstd"})

Each Spark partition is one task of ``mapInArrow`` that calls :func:`write_partition` with
the partition's number (not the task attempt id), so a retried or speculative attempt
rewrites the same ``part-NNNNN`` folder, and returns its fragment as one JSON string; the
driver merges those (nothing downloaded, workers' disks never read).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from typing import Any

from astream._checks import check_int
from astream.convert._engine import Job, job_from_mds_kwargs
from astream.convert._merge import merge_index as _merge_index
from astream.convert._part import PartFragment
from astream.convert.files import FileInputs
from astream.errors import ConfigError, MissingExtraError

__all__ = ["dataframe_to_mds", "files_to_mds", "spark_arrow_schema"]


def _pyspark() -> Any:
    try:
        import pyspark
    except ImportError as exc:
        raise MissingExtraError("dataframe_to_mds", "spark", "pyspark") from exc
    return pyspark


def spark_arrow_schema(dataframe: Any) -> Any:
    """The Arrow schema of a Spark DataFrame (the types its partitions arrive in)."""
    _pyspark()
    import inspect

    import pyarrow as pa
    from pyspark.sql.pandas.types import to_arrow_schema
    from pyspark.sql.types import StructType

    # Newer pyspark wants the session time zone for timestamps (the instant is the same).
    extra: dict[str, Any] = {"timezone": "UTC"} if "timezone" in inspect.signature(to_arrow_schema).parameters else {}
    fields = []
    for field in dataframe.schema.fields:
        try:
            fields.append(to_arrow_schema(StructType([field]), **extra).field(0))
        except Exception as exc:  # pyspark raises several kinds for a type Arrow lacks
            raise ConfigError(f"column {field.name!r} has Spark type {field.dataType.simpleString()}, which has "
                              f"no Arrow form ({exc}); cast or drop it") from exc
    return pa.schema(fields)


def _task(job: Job) -> Callable[[Iterator[Any]], Iterator[Any]]:
    def write(batches: Iterator[Any]) -> Iterator[Any]:
        import pyarrow as pa
        from pyspark import TaskContext

        context = TaskContext.get()
        if context is None:  # pragma: no cover - always set inside a task
            raise ConfigError("dataframe_to_mds: no Spark TaskContext in the partition function")
        fragment = job.write(batches, context.partitionId())
        yield pa.RecordBatch.from_pydict({"fragment": [fragment.to_json()]})

    return write


def dataframe_to_mds(
    dataframe: Any,
    merge_index: bool = True,
    mds_kwargs: Mapping[str, Any] | None = None,
    udf_iterable: Callable[..., Iterable[Mapping[str, Any]]] | None = None,
    udf_kwargs: Mapping[str, Any] | None = None,
) -> tuple[str, str]:
    """Convert a Spark DataFrame to one MDS dataset, a part per partition.

    Args:
        dataframe: a ``pyspark.sql.DataFrame``.
        merge_index: write the merged ``index.json`` at ``out`` (else only the parts'
            indexes; :func:`astream.convert.merge_index` merges them later).
        mds_kwargs: ``out`` (a folder, a URL, or a ``(local, remote)`` pair), ``columns``
            (inferred from the DataFrame's schema when omitted), ``keep_local``,
            ``compression`` (``"zstd"`` when the key is absent, as MosaicML defaults it;
            ``None`` writes uncompressed shards), ``hashes``, ``size_limit``.
        udf_iterable: ``udf(pandas_frame, **udf_kwargs)`` yielding the sample dicts of each
            chunk of a partition (``columns`` is then required).
        udf_kwargs: keyword arguments of ``udf_iterable``.

    Returns:
        ``mds_path`` as MosaicML returns it: ``(local, remote)``, ``""`` for a missing side
        (``(out, "")`` for a local ``out``). A failing sample fails the job.

    Raises:
        ConfigError: bad ``mds_kwargs`` or a column type MDS cannot store (before any task).
        MissingExtraError: pyspark is not installed.
    """
    _pyspark()
    if dataframe is None:
        raise ConfigError("dataframe_to_mds: the dataframe is None")
    schema = None if udf_iterable is not None else spark_arrow_schema(dataframe)
    job = job_from_mds_kwargs(_zstd_by_default(mds_kwargs), schema, udf_iterable, udf_kwargs)
    rows = dataframe.mapInArrow(_task(job), "fragment string").collect()
    fragments = [PartFragment.from_json(row["fragment"]) for row in rows]
    local, remote = job.roots
    if merge_index and fragments:
        _merge_index(fragments, job.out, keep_local=job.keep_local or remote is None)
    return local or "", remote or ""


def _zstd_by_default(mds_kwargs: Mapping[str, Any] | None) -> dict[str, Any]:
    """``mds_kwargs`` with MosaicML's default compression where it names none."""
    kwargs = dict(mds_kwargs or {})
    kwargs.setdefault("compression", "zstd")
    return kwargs


def _files_task(job: Job, inputs: FileInputs) -> Callable[[int], str]:
    def write(group: int) -> str:
        # The group's number names the part, so a retried task rewrites the same one.
        return job.write(inputs.batches(group), group).to_json()

    return write


def files_to_mds(
    session: Any,
    paths: Sequence[str],
    fmt: str,
    mds_kwargs: Mapping[str, Any],
    merge_index: bool = True,
    target_bytes: int = 256 << 20,
    tasks: int | None = None,
) -> tuple[str, str]:
    """Convert Parquet, JSONL or image files to one MDS dataset on Spark, the tasks reading the files.

    For inputs Spark cannot read by itself (``s3://``, ``gs://``, ``azure://`` without the
    Hadoop connector jars): the driver lists ``paths`` with astream's storage, each task
    downloads its group of files through it and writes a part (see
    :mod:`astream.convert.files`). Nothing is shuffled through the JVM.

    Args:
        session: the ``SparkSession``.
        paths: files, folders or prefixes (local or any URL astream's storage reads).
        fmt: ``parquet``, ``jsonl`` or ``image``.
        mds_kwargs: as for :func:`dataframe_to_mds` (``out``, ``columns``, ``compression``
            with ``"zstd"`` by default...).
        merge_index: write the merged ``index.json``.
        target_bytes: input bytes per task; at least ``defaultParallelism`` tasks where
            there are files enough.
        tasks: cut the files into about this many tasks instead (at most one per file).

    Returns:
        ``mds_path`` as :func:`dataframe_to_mds` returns it.

    Raises:
        ConfigError: bad ``mds_kwargs``, no input files, or a column type MDS cannot store
            (all before any task runs).
        MissingExtraError: pyspark is not installed.
    """
    _pyspark()
    context = session.sparkContext
    if tasks is not None:
        check_int("tasks", tasks, 1)
        inputs = FileInputs.plan(paths, fmt, target_bytes=1 << 62, min_groups=tasks)
    else:
        check_int("target_bytes", target_bytes, 1)
        inputs = FileInputs.plan(paths, fmt, target_bytes=target_bytes, min_groups=int(context.defaultParallelism))
    job = job_from_mds_kwargs(_zstd_by_default(mds_kwargs), inputs.schema)
    count = len(inputs.groups)
    texts = context.parallelize(range(count), count).map(_files_task(job, inputs)).collect()
    fragments = [PartFragment.from_json(text) for text in texts]
    local, remote = job.roots
    if merge_index:
        _merge_index(fragments, job.out, keep_local=job.keep_local or remote is None)
    return local or "", remote or ""
