"""Ray Data: ``ds.write_datasink(MDSDatasink(out, columns=...))``.

Each write task writes its blocks as ``out/part-{task_idx:05d}`` and returns the part's
fragment; ``on_write_complete`` merges them on the driver. If the write fails,
``on_write_failed`` writes nothing, so no index ever lists a half dataset (the parts
written stay, for a retry or :func:`astream.convert.merge_index` by listing).
"""

from __future__ import annotations

import itertools
from collections.abc import Iterable, Mapping
from typing import Any

from astream.convert._engine import Job, job_from_mds_kwargs
from astream.convert._merge import merge_index
from astream.convert._part import Out, PartFragment, write_partition
from astream.convert._types import arrow_columns
from astream.errors import MissingExtraError

__all__ = ["MDSDatasink"]

try:
    from ray.data import Datasink as _Datasink
except ImportError as _exc:  # pragma: no cover - without the ray extra
    raise MissingExtraError("MDSDatasink", "ray", "ray[data]") from _exc


class MDSDatasink(_Datasink["PartFragment"]):
    """A Ray Data sink writing one MDS dataset, a part per write task.

    Args:
        out: the dataset root: a folder, a URL, or a ``(local, remote)`` pair.
        columns: encodings overriding those inferred from the blocks' Arrow schema.
        keep_local: with a pair, keep uploaded shards locally.
        merge: write the merged ``index.json`` when the write completes.
        **mds_kwargs: ``compression``, ``hashes``, ``size_limit``.

    Attributes:
        fragments: the parts written, after a successful write.
        index: where the merged index was written, after a successful write.

    Raises:
        ConfigError: a bad setting; a column type MDS cannot store is refused in
            ``on_write_start``, before any write task runs.
    """

    def __init__(self, out: Out, columns: Mapping[str, str] | None = None, *, keep_local: bool = False,
                 merge: bool = True, **mds_kwargs: Any) -> None:
        self._columns = dict(columns or {})
        self._job: Job = job_from_mds_kwargs(
            {**mds_kwargs, "out": out, "keep_local": keep_local, "columns": self._columns or {"_": "int"}}, None)
        self._merge = merge
        self.fragments: list[PartFragment] = []
        self.index: str | None = None

    def on_write_start(self, schema: Any = None) -> None:
        """Check the columns against the first block's schema (fails before any task)."""
        if schema is not None:
            arrow_columns(schema, self._columns)

    def write(self, blocks: Iterable[Any], ctx: Any) -> PartFragment:
        """Write this task's blocks as one part; returns its fragment."""
        stream = iter(blocks)
        first = next(stream, None)
        if first is None:  # an empty task still writes its (shard-less) part
            return write_partition([], self._job.out, int(ctx.task_idx), self._columns or None,
                                   keep_local=self._job.keep_local, **self._job.writer)
        schema = first.schema if hasattr(first, "schema") and not hasattr(first, "iloc") else None
        columns = arrow_columns(schema, self._columns) if schema is not None else self._columns
        job = Job(self._job.out, columns, self._job.keep_local, self._job.writer)
        return job.write(itertools.chain([first], stream), int(ctx.task_idx))

    def on_write_complete(self, write_result: Any) -> None:
        """Merge the fragments of all write tasks into index.json (on the driver)."""
        returns = write_result.write_returns if hasattr(write_result, "write_returns") else write_result
        self.fragments = sorted((f for f in returns if isinstance(f, PartFragment)), key=lambda f: f.partition_id)
        if self._merge and self.fragments:
            _, remote = self._job.roots
            self.index = merge_index(self.fragments, self._job.out, keep_local=self._job.keep_local or remote is None)

    def on_write_failed(self, error: Exception) -> None:
        """Write no index: a failed write must not look like a dataset."""
        self.fragments = []
        self.index = None
