"""Dask: ``to_mds(ddf, out)``, a part per partition of ``ddf.to_delayed()``.

Partition ``k`` of the frame is written as ``out/part-{k:05d}`` by one delayed task, which
returns its fragment; the driver merges the fragments. A task re-run after a worker died
rewrites the same part, so the dataset holds every row once.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping
from typing import Any

from astream.convert._engine import Job, job_from_mds_kwargs
from astream.convert._merge import merge_index as _merge_index
from astream.convert._part import Out, PartFragment
from astream.errors import MissingExtraError

__all__ = ["frame_arrow_schema", "to_mds"]


def _dask() -> Any:
    try:
        import dask
    except ImportError as exc:
        raise MissingExtraError("astream.convert.dask", "dask", "dask[distributed]") from exc
    return dask


def frame_arrow_schema(ddf: Any) -> Any:
    """The Arrow schema of a Dask DataFrame: from its meta, or its first rows where the meta says ``object``."""
    import pyarrow as pa

    meta = ddf._meta
    if not any(str(t) == "object" for t in meta.dtypes):
        return pa.Schema.from_pandas(meta, preserve_index=False)
    head = ddf.head(16, npartitions=-1)
    return pa.Table.from_pandas(head, preserve_index=False).schema


def _write_one(pdf: Any, job: Job, schema: Any, partition_id: int) -> PartFragment:
    import pyarrow as pa

    if job.udf_iterable is not None:
        return job.write([pdf], partition_id)
    table = pa.Table.from_pandas(pdf, schema=schema, preserve_index=False) if len(pdf) else schema.empty_table()
    return job.write(table.to_batches(max_chunksize=4096) or [table], partition_id)


def _run(dask: Any, tasks: list[Any], progress: Callable[[PartFragment], None] | None) -> list[PartFragment]:
    client = None
    if progress is not None:
        try:
            from distributed import get_client

            client = get_client()
        except (ImportError, ValueError):
            client = None
    if client is None or progress is None:
        fragments = list(dask.compute(*tasks))
        if progress is not None:
            for fragment in fragments:
                progress(fragment)
        return fragments
    import distributed

    compute: Any = client.compute
    futures: list[Any] = compute(tasks)
    completed: Any = distributed.as_completed
    for future in completed(futures):
        progress(future.result())
    return [f.result() for f in futures]


def to_mds(
    ddf: Any,
    out: Out,
    columns: Mapping[str, str] | None = None,
    *,
    merge_index: bool = True,
    keep_local: bool = False,
    udf_iterable: Callable[..., Iterable[Mapping[str, Any]]] | None = None,
    udf_kwargs: Mapping[str, Any] | None = None,
    progress: Callable[[PartFragment], None] | None = None,
    **mds_kwargs: Any,
) -> list[PartFragment]:
    """Convert a Dask DataFrame to one MDS dataset at ``out``.

    Runs on the active scheduler (a ``distributed.Client`` if one exists).

    Args:
        ddf: a ``dask.dataframe.DataFrame``.
        out: the dataset root: a folder, a URL, or a ``(local, remote)`` pair.
        columns: encodings overriding those inferred from the frame's schema (required
            with ``udf_iterable``).
        merge_index: write the merged ``index.json``.
        keep_local: with a pair, keep uploaded shards locally.
        udf_iterable: ``udf(pandas_frame, **udf_kwargs)`` yielding a partition's samples.
        udf_kwargs: its keyword arguments.
        progress: called on the driver with each part's fragment as it completes
            (with a ``distributed`` client; otherwise once per part at the end).
        **mds_kwargs: ``compression``, ``hashes``, ``size_limit``.

    Returns:
        The fragments of the parts, in partition order.

    Raises:
        ConfigError: a bad setting or a column type MDS cannot store (before any task).
    """
    dask = _dask()
    schema = frame_arrow_schema(ddf)
    job = job_from_mds_kwargs({**mds_kwargs, "out": out, "keep_local": keep_local,
                               **({"columns": dict(columns)} if columns else {})},
                              None if udf_iterable is not None else schema, udf_iterable, udf_kwargs)
    tasks = [dask.delayed(_write_one)(part, job, schema, k, dask_key_name=f"astream-part-{k}")
             for k, part in enumerate(ddf.to_delayed())]
    fragments = _run(dask, tasks, progress)
    _, remote = job.roots
    if merge_index and fragments:
        _merge_index(fragments, job.out, keep_local=keep_local or remote is None)
    return fragments
