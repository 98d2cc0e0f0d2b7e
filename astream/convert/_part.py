"""``write_partition``: one partition of a distributed frame into ``out/part-NNNNN/``.

Every engine adapter (Spark, Ray Data, Dask, the CLI's local engine) calls this in its
tasks. The folder name comes from the partition number alone, so a retried or speculative
attempt writes the same file names with the same bytes and replaces them: it never leaves
a second copy. Where the shards go:

* ``out`` a remote URL (``s3://...``): each shard is staged in a temporary folder,
  uploaded as soon as it is closed and deleted (disk in use: about one shard per task).
* ``out`` a ``(local, remote)`` pair: staged in ``local/part-NNNNN``, uploaded, and
  deleted unless ``keep_local``.
* ``out`` a local folder: written in a private staging folder and moved into
  ``out/part-NNNNN`` file by file (an atomic rename each), so two attempts never mix.

The part gets its own ``index.json`` (for recovery by listing); the task returns a
:class:`PartFragment` with the part's shard entries, which the driver merges without
downloading anything (:func:`astream.convert.merge_index`).
"""

from __future__ import annotations

import contextlib
import itertools
import json
import os
import shutil
import tempfile
import uuid
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

from astream._format.files import fsync_dir
from astream._format.index import INDEX_NAME, Index, ShardInfo
from astream._format.record import RecordLayout
from astream._storage.registry import join_url, scheme_of
from astream._storage.upload import MDSWriter as UploadingWriter
from astream.convert._records import batch_records
from astream.convert._types import arrow_columns, batch_samples
from astream.errors import ConfigError

__all__ = ["STAGING_DIR", "PartFragment", "part_name", "split_out", "write_partition"]

Out = str | os.PathLike[str] | tuple[str | os.PathLike[str], str]
STAGING_DIR = ".astream-staging"
_WRITER_KWARGS = ("compression", "hashes", "size_limit")


def part_name(partition_id: int) -> str:
    """``part-00007``: the folder of a partition, from its number alone."""
    return f"part-{partition_id:05d}"


def split_out(out: Out) -> tuple[str | None, str | None]:
    """``(local, remote)`` of an ``out``: a local folder, a remote URL, or a pair.

    Raises:
        ConfigError: ``out`` is none of those.
    """
    if isinstance(out, tuple | list):
        if len(out) != 2:
            raise ConfigError(f"out must be a folder, a URL or a (local, remote) pair, got {out!r}")
        local, remote = os.fspath(out[0]) or None, (str(out[1]) or None)
        return local, remote
    path = os.fspath(out)
    if not isinstance(path, str) or not path:
        raise ConfigError(f"out must be a folder, a URL or a (local, remote) pair, got {out!r}")
    if path.startswith("file://"):
        return path[len("file://"):], None
    return (None, path) if scheme_of(path) else (path, None)


@dataclass(frozen=True)
class PartFragment:
    """What a task hands back to the driver: the index entries of one written part.

    Attributes:
        partition_id: the partition's number (the part folder is ``part-{id:05d}``).
        shards: the part's shard entries as its ``index.json`` lists them (base names
            relative to the part folder).
        local: the dataset's local root, if there is one.
        remote: the dataset's remote root, if there is one.
    """

    partition_id: int
    shards: tuple[Mapping[str, Any], ...]
    local: str | None = None
    remote: str | None = None

    @property
    def samples(self) -> int:
        """The samples in this part."""
        return sum(int(s["samples"]) for s in self.shards)

    def to_json(self) -> str:
        """A compact JSON text of the fragment (what Spark tasks return as a string column)."""
        return json.dumps({"partition_id": self.partition_id, "shards": list(self.shards),
                           "local": self.local, "remote": self.remote}, sort_keys=True)

    @classmethod
    def from_json(cls, text: str | bytes) -> PartFragment:
        """The fragment :meth:`to_json` wrote."""
        obj = json.loads(text)
        return cls(int(obj["partition_id"]), tuple(obj["shards"]), obj.get("local"), obj.get("remote"))


class _PartWriter(UploadingWriter):
    """The uploading writer, one upload at a time; to a local destination each file is moved."""

    def __init__(self, staging: str, dest: str, local_dest: bool, keep_local: bool, **kwargs: Any) -> None:
        self._dest_is_local = local_dest
        # keep_local=False: the writer deletes each shard once delivered, so a task's disk
        # holds about one shard whatever the partition's size.
        super().__init__((staging, dest), exist_ok=True, keep_local=keep_local, max_workers=1, max_pending=1,
                         **kwargs)

    def _durable_shards(self) -> bool:
        # Moved into a local dataset: fsynced first. Uploaded: as for any uploading writer.
        return self._dest_is_local or super()._durable_shards()

    async def _upload(self, path: str, url: str) -> None:
        if self._dest_is_local:
            os.makedirs(os.path.dirname(url), exist_ok=True)
            os.replace(path, url)  # same file system: an atomic rename, no copy
            if os.path.basename(path) == INDEX_NAME:  # the part's last file: make its renames durable
                fsync_dir(os.path.dirname(url))
            return
        await super()._upload(path, url)


def _samples(rows: Any, columns: Mapping[str, str] | None) -> tuple[Iterable[Mapping[str, Any] | _Records],
                                                                    dict[str, str] | None]:
    """Rows of any accepted kind as samples, and the columns (inferred from Arrow if not given)."""
    pa = _maybe_pyarrow()
    if (pa is not None and isinstance(rows, pa.Table | pa.RecordBatch)) or _is_pandas(rows):
        rows = [rows]
    iterator = iter(rows)
    first = next(iterator, None)
    if first is None:
        return [], dict(columns) if columns else None
    if pa is not None and (_is_pandas(first) or isinstance(first, pa.Table | pa.RecordBatch)):
        first_batch = _to_arrow(pa, first)
        cols = arrow_columns(first_batch.schema, columns)

        layout = RecordLayout.from_columns(cols)

        def arrow_rows() -> Iterable[Mapping[str, Any] | _Records]:
            # One batch at a time: a partition is never held in memory whole. A batch of
            # plain columns becomes records in bulk; any other goes sample by sample.
            for batch in itertools.chain([first_batch], (_to_arrow(pa, b) for b in iterator)):
                plain = _as_batch(pa, batch)
                records = batch_records(pa, plain, layout) if plain is not None else None
                if records is None:
                    yield from batch_samples(batch, cols)
                else:
                    yield _Records(records)

        return arrow_rows(), cols
    if columns is None:
        raise ConfigError("rows of dicts need columns= (column name -> MDS encoding); only Arrow or pandas "
                          "data carry a schema to infer them from")

    def dict_rows() -> Iterable[Mapping[str, Any]]:
        yield first
        yield from iterator

    return dict_rows(), dict(columns)


@dataclass(frozen=True)
class _Records:
    """A batch's samples already encoded as MDS records."""

    records: list[bytes]


def _as_batch(pa: Any, data: Any) -> Any:
    """``data`` as one RecordBatch holding the columns, or None where it cannot be one cheaply."""
    if isinstance(data, pa.RecordBatch):
        return data
    if isinstance(data, pa.Table) and data.num_rows:
        return data.combine_chunks().to_batches()[0]
    return None


def _maybe_pyarrow() -> Any:
    try:
        import pyarrow as pa
    except ImportError:  # pragma: no cover - the convert extra brings it
        return None
    return pa


def _is_pandas(obj: Any) -> bool:
    return type(obj).__name__ == "DataFrame" and type(obj).__module__.startswith("pandas")


def _to_arrow(pa: Any, data: Any) -> Any:
    if _is_pandas(data):
        return pa.Table.from_pandas(data, preserve_index=False)
    return data


def write_partition(
    rows: Any,
    out: Out,
    partition_id: int,
    columns: Mapping[str, str] | None = None,
    *,
    keep_local: bool = False,
    compression: str | None = None,
    hashes: Sequence[str] | None = None,
    size_limit: int | str | None = 1 << 26,
    **mds_kwargs: Any,
) -> PartFragment:
    """Write one partition as ``out/part-{partition_id:05d}/`` and return its index entries.

    Args:
        rows: the partition's samples: an iterable of dicts, a ``pyarrow.Table`` or
            ``RecordBatch``, a pandas DataFrame, or an iterable of batches or frames.
        out: the dataset root: a local folder, a remote URL, or a ``(local, remote)`` pair.
        partition_id: the partition's number, from 0; it alone names the part.
        columns: column name -> encoding. Inferred from the Arrow schema when omitted
            (dict rows need it); entries given override the inferred ones.
        keep_local: with a ``(local, remote)`` pair, keep the uploaded shards locally.
        compression, hashes, size_limit: as for :class:`astream.MDSWriter`.
        **mds_kwargs: other MDSWriter arguments MosaicML accepts that change nothing here
            (``progress_bar``, ``max_workers``, ``exist_ok``); anything else is refused.

    Returns:
        The part's :class:`PartFragment` (an empty partition returns one without shards).

    Raises:
        ConfigError: a bad ``out``, ``partition_id``, column or MDSWriter argument.
        SampleError: a row does not fit the columns.
        UploadError: a shard could not be uploaded.
    """
    if isinstance(partition_id, bool) or not isinstance(partition_id, int) or partition_id < 0:
        raise ConfigError(f"partition_id must be a non-negative integer, got {partition_id!r}")
    unknown = sorted(set(mds_kwargs) - {"progress_bar", "max_workers", "exist_ok", "out", "columns"})
    if unknown:
        raise ConfigError(f"write_partition got unknown MDSWriter argument(s) {', '.join(unknown)}")
    local, remote = split_out(out)
    samples, cols = _samples(rows, columns)
    if cols is None:
        # An empty partition without columns: its part lists no shards, so no column is ever recorded.
        cols = {"_": "int"}
    name = part_name(partition_id)
    if remote is not None:
        dest, dest_is_local = join_url(remote, name), False
        staging = os.path.join(local, name) if local else tempfile.mkdtemp(prefix=f"astream-{name}-")
    else:
        assert local is not None
        dest, dest_is_local = os.path.join(local, name), True
        staging = os.path.join(local, STAGING_DIR, f"{name}-{uuid.uuid4().hex[:12]}")
    keep = keep_local and local is not None
    try:
        with _PartWriter(staging, dest, dest_is_local, keep, columns=cols, compression=compression,
                         hashes=hashes, size_limit=size_limit) as writer:
            for sample in samples:
                if isinstance(sample, _Records):
                    writer.write_records(sample.records)
                else:
                    writer.write(sample)
        shards = tuple(s.to_json() for s in writer.shards)
        if dest_is_local:
            _prune(dest, {INDEX_NAME, *(s.stored.basename for s in writer.shards)})
    finally:
        if not keep or dest_is_local:
            shutil.rmtree(staging, ignore_errors=True)
        if dest_is_local:
            _remove_empty(os.path.join(local or "", STAGING_DIR))
    return PartFragment(partition_id, shards, local, remote)


def _prune(folder: str, keep: set[str]) -> None:
    """Delete what an earlier attempt with other settings left in a local part folder."""
    for name in os.listdir(folder):
        if name not in keep:
            with contextlib.suppress(OSError):
                os.unlink(os.path.join(folder, name))


def _remove_empty(folder: str) -> None:
    with contextlib.suppress(OSError):  # other tasks still stage there, or it is gone
        os.rmdir(folder)


def fragment_of_index(partition_id: int, index: Index, local: str | None, remote: str | None) -> PartFragment:
    """A fragment rebuilt from a part's own index.json (recovery by listing)."""
    shards: tuple[ShardInfo, ...] = tuple(index.shards)
    return PartFragment(partition_id, tuple(s.to_json() for s in shards), local, remote)
