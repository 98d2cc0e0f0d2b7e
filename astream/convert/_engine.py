"""What the engine adapters share: MosaicML's ``mds_kwargs`` split up, and the per-task call.

Each adapter turns its engine's partition into ``rows`` for :func:`write_partition` and
hands back the :class:`PartFragment`; everything else (columns, ``out``, the writer's
options, ``udf_iterable``) is decided here once, on the driver, so the three adapters
cannot drift apart.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterable, Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any

from astream.convert._part import Out, PartFragment, split_out, write_partition
from astream.convert._types import arrow_columns
from astream.errors import ConfigError

__all__ = ["Job", "job_from_mds_kwargs"]

_WRITER_KEYS = ("compression", "hashes", "size_limit")
_IGNORED_KEYS = ("progress_bar", "max_workers", "exist_ok")


@dataclass(frozen=True)
class Job:
    """One conversion's settings, picklable: every task gets a copy.

    Attributes:
        out: the dataset root (a folder, a URL, or a ``(local, remote)`` pair).
        columns: column name -> encoding (decided on the driver).
        keep_local: keep uploaded shards in the local folder of a pair.
        writer: compression, hashes and size_limit.
        udf_iterable: ``udf(frame, **udf_kwargs)`` yielding sample dicts, or None.
        udf_kwargs: its keyword arguments.
    """

    out: Out
    columns: Mapping[str, str]
    keep_local: bool = False
    writer: Mapping[str, Any] = field(default_factory=dict)
    udf_iterable: Callable[..., Iterable[Mapping[str, Any]]] | None = None
    udf_kwargs: Mapping[str, Any] = field(default_factory=dict)

    def write(self, frames: Iterable[Any], partition_id: int) -> PartFragment:
        """Write one partition given as Arrow batches or pandas frames."""
        rows: Iterable[Any] = frames
        if self.udf_iterable is not None:
            rows = self._udf_rows(frames)
        return write_partition(rows, self.out, partition_id, self.columns, keep_local=self.keep_local,
                               **self.writer)

    def _udf_rows(self, frames: Iterable[Any]) -> Iterator[Mapping[str, Any]]:
        assert self.udf_iterable is not None
        for frame in frames:
            pdf = frame.to_pandas() if hasattr(frame, "schema") and not hasattr(frame, "iloc") else frame
            yield from self.udf_iterable(pdf, **self.udf_kwargs)

    @property
    def roots(self) -> tuple[str | None, str | None]:
        """``(local, remote)`` of ``out``."""
        return split_out(self.out)


def job_from_mds_kwargs(
    mds_kwargs: Mapping[str, Any] | None,
    schema: Any,
    udf_iterable: Callable[..., Iterable[Mapping[str, Any]]] | None = None,
    udf_kwargs: Mapping[str, Any] | None = None,
) -> Job:
    """The :class:`Job` of MosaicML-style ``mds_kwargs`` (``out``, ``columns``, ``keep_local``...).

    Args:
        mds_kwargs: MDSWriter arguments; ``out`` is required, ``columns`` too with a udf.
        schema: the input's Arrow schema (columns are inferred from it), or None.
        udf_iterable, udf_kwargs: the per-partition sample generator and its arguments.

    Raises:
        ConfigError: ``out`` missing, ``columns`` missing with a udf, an unknown key, or a
            column type MDS cannot store (before any task runs).
    """
    kwargs = dict(mds_kwargs or {})
    if "out" not in kwargs:
        raise ConfigError("mds_kwargs needs 'out': the dataset root (a folder, a URL or a (local, remote) pair)")
    out = kwargs.pop("out")
    if isinstance(out, list):
        out = tuple(out)
    split_out(out)  # validates
    columns = kwargs.pop("columns", None)
    keep_local = bool(kwargs.pop("keep_local", False))
    writer = {k: kwargs.pop(k) for k in _WRITER_KEYS if k in kwargs}
    for key in _IGNORED_KEYS:
        kwargs.pop(key, None)
    if kwargs:
        raise ConfigError(f"mds_kwargs has unknown key(s) {', '.join(sorted(kwargs))}; it takes out, columns, "
                          f"keep_local, {', '.join(_WRITER_KEYS)}")
    if udf_iterable is not None:
        if not columns:
            raise ConfigError("with udf_iterable, mds_kwargs must give 'columns' (the udf makes new samples, "
                              "so the input's schema says nothing about them)")
        cols = arrow_columns(_columns_schema(columns), columns)
    elif schema is not None:
        cols = arrow_columns(schema, columns)
    elif columns:
        cols = dict(columns)
    else:
        raise ConfigError("mds_kwargs has no 'columns' and the input has no schema to infer them from")
    return Job(out=_normal_out(out), columns=cols, keep_local=keep_local, writer=writer,
               udf_iterable=udf_iterable, udf_kwargs=dict(udf_kwargs or {}))


def _columns_schema(columns: Mapping[str, str]) -> Any:
    """A schema of null fields, only to validate explicit encodings through arrow_columns."""
    import pyarrow as pa

    return pa.schema([(name, pa.null()) for name in columns])


def _normal_out(out: Any) -> Out:
    if isinstance(out, tuple):
        return (os.fspath(out[0]), str(out[1]))
    path: str = os.fspath(out)
    return path
