"""``ShardWriter``: what every shard format's writer shares (MDS, JSONL, CSV/TSV/XSV).

A writer turns each sample into one record, collects records until the next one would
push the shard past ``size_limit``, then writes the shard's file(s) (compressed if asked,
hashed with every algorithm asked) and finally ``index.json``. The rules are MosaicML
Streaming's, so the bytes are too: shard names ``shard.<5 digits>.<format>[.meta][.<ext>]``,
the overflow test ``size_limit < shard_size + record_size`` (which writes a 0-sample shard
when even an empty shard cannot take the record), one shard entry per shard with the
writer's config repeated in it.

Each file is written atomically and index.json last, so a directory either has an index
whose shards all exist, or no index. Storage backends subclass a format's writer and
upload from :meth:`ShardWriter._after_shard` and :meth:`ShardWriter._after_index`.
Formats subclass this and say how a sample becomes a record (:meth:`_encode`), what a
shard's files hold (:meth:`_shard_files`) and what its index entry says (:meth:`_shard_entry`).
"""

from __future__ import annotations

import contextlib
import copy
import json
import os
import shutil
import warnings
from collections.abc import Iterable, Mapping, Sequence
from types import TracebackType
from typing import TYPE_CHECKING, Any, ClassVar

import numpy as np

from astream._format.compression import Codec, get_codec
from astream._format.files import BackgroundCommit, atomic_write, fsync_dir
from astream._format.hashing import check_algorithm, new_hasher
from astream._format.index import INDEX_NAME, FileInfo, Index, ShardInfo
from astream._units import parse_bytes
from astream.errors import ConfigError, OutputExistsError, UsageError

if TYPE_CHECKING:
    from typing_extensions import Self

__all__ = ["ShardFile", "ShardWriter", "config_bytes"]

_MAX_SIZE_LIMIT = 1 << 32  # offsets are uint32 in every format

ShardFile = tuple[str | None, list[bytes]]
"""One file of a shard: its name's extra part (``None`` for the data file, ``"meta"``) and its bytes in pieces."""


class ShardWriter:
    """The format-independent part of a shard writer; see the module docstring.

    Args:
        out: the output directory (created if needed).
        columns: column name -> encoding, checked by the format.
        compression: ``None`` or an algorithm like ``"zstd"``, ``"zstd:7"``, ``"gz"``, ``"br"``,
            ``"bz2"``, ``"snappy"``. With compression only the compressed files are kept.
        hashes: hash algorithms to record for every file (``["sha1", "xxh64"]``).
        size_limit: start a new shard before one would exceed this many bytes (an int or a
            string like ``"64mb"``); ``None`` or 0 puts everything into one shard.
        exist_ok: if ``out`` exists and is not empty, delete its contents (True) or raise (False).

    Raises:
        ConfigError: a bad ``out``, ``columns``, ``hashes`` or ``size_limit``.
        OutputExistsError: ``out`` is not empty and ``exist_ok`` is False (a ``FileExistsError``).
        CompressionError: an unknown compression algorithm.
    """

    format: ClassVar[str] = ""
    _config: dict[str, Any]  # what each shard entry repeats; set by the format's writer
    #: Bytes a shard and each record add to the shard's size beyond the records
    #: themselves, as MosaicML counts them (its ``extra_bytes_per_shard/sample``).
    _shard_overhead: int = 0
    _sample_overhead: int = 0

    def __init__(
        self,
        out: str | os.PathLike[str],
        columns: Mapping[str, str],
        compression: str | None = None,
        hashes: Sequence[str] | None = None,
        size_limit: int | str | None = 1 << 26,
        exist_ok: bool = False,
    ) -> None:
        self.local = self._local_dir(out)
        if not isinstance(columns, Mapping) or not columns:
            raise ConfigError(f"columns must be a non-empty dict of column name -> encoding, got {columns!r}")
        if not all(isinstance(name, str) for name in columns):
            raise ConfigError(f"column names must be strings, got {list(columns)!r}")
        self.compression = compression or None
        self._codec: Codec | None = None if self.compression is None else get_codec(self.compression)
        if self._codec is not None:
            self._codec.compress(b"")  # fail now, not at the first flush, if an extra is missing
        if isinstance(hashes, str):
            raise ConfigError(f"hashes must be a list of algorithm names, got the string {hashes!r}")
        # Sorted and unique, as MDS requires (MosaicML's writer rejects any other order).
        self.hashes = sorted({check_algorithm(a, "hashes") for a in (hashes or ())})
        limit = None if size_limit is None else parse_bytes(size_limit, "size_limit")
        if limit is not None and limit >= _MAX_SIZE_LIMIT:
            raise ConfigError(f"size_limit must be below 4 GiB (shard offsets are uint32), got {size_limit!r}")
        self.size_limit = limit or None
        self._exist_ok = exist_ok
        self._records: list[bytes] = []
        self._shard_size = 0
        self._shards: list[ShardInfo] = []
        self._num_written = 0
        self._finished = False
        self._pending: list[BackgroundCommit] = []

    def _start(self) -> None:
        """Prepare the directory once the format has checked its own arguments."""
        self._prepare_dir(self._exist_ok)
        self._shard_size = self._shard_overhead

    def _base_config(self) -> dict[str, Any]:
        """The config keys every format's shard entries and meta files carry."""
        return {
            "compression": self.compression,
            "format": self.format,
            "hashes": list(self.hashes),
            "size_limit": self.size_limit,
            "version": 2,
        }

    # --- what a format says --------------------------------------------------------------

    def _encode(self, sample: Mapping[str, Any], position: int) -> bytes:
        """The record of sample number ``position``; raise SampleError if it does not fit."""
        raise NotImplementedError

    def _shard_files(self, records: list[bytes]) -> list[ShardFile]:
        """The files of a shard holding ``records``, the data file first."""
        raise NotImplementedError

    def _shard_entry(self, position: int, samples: int, files: list[tuple[FileInfo, FileInfo | None]]) -> ShardInfo:
        """The index entry of a shard, given (raw, compressed) info of each of its files."""
        raise NotImplementedError

    # --- hooks for subclasses (the storage layer uploads from here) -------------------

    def _local_dir(self, out: str | os.PathLike[str]) -> str:
        """The local directory shards go to; subclasses map remote URLs to a staging dir."""
        path = os.fspath(out)
        if not isinstance(path, str) or not path:
            raise ConfigError(f"out must be a directory path, got {out!r}")
        if "://" in path:
            raise ConfigError(f"out={path!r}: this writer writes to local directories only")
        return path

    def _after_shard(self, paths: list[str]) -> None:
        """Called once a shard's final file(s) are durable and in place (no-op here).

        Called on the writer's thread, in shard order, and always before index.json is
        written. Because a shard's fsync overlaps with encoding the next one, the call for
        shard k comes when shard k + 1 is flushed (or at :meth:`finish`). Not called for a
        shard still in flight when the writer is aborted.
        """

    def _after_index(self, path: str) -> None:
        """Called once index.json is in place, after every shard's hook (no-op here)."""

    def _durable_shards(self) -> bool:
        """Whether shard files are fsynced before they are renamed into place.

        True here: the local directory is the dataset. A writer that only stages shards for
        an upload and deletes them afterwards answers False.
        """
        return True

    # --- public API -------------------------------------------------------------------

    def get_config(self) -> dict[str, Any]:
        """The writer's settings as every shard entry of its ``index.json`` repeats them
        (``version``, ``format``, ``compression``, ``hashes``, ``size_limit`` and the format's
        own keys), as MosaicML's ``get_config()`` returns them."""
        return copy.deepcopy(self._config)

    @property
    def num_samples(self) -> int:
        """Samples accepted so far."""
        return self._num_written

    @property
    def shards(self) -> tuple[ShardInfo, ...]:
        """The shards written so far, as index.json will list them."""
        return tuple(self._shards)

    def write(self, sample: Mapping[str, Any]) -> None:
        """Add one sample; a full shard is flushed to disk first if it would overflow.

        Raises:
            SampleError: the sample does not match the columns (nothing is written for it).
            UsageError: the writer is already finished.
        """
        if self._finished:
            raise UsageError(f"{type(self).__name__}({self.local!r}) is finished; create a new writer to add samples")
        self._add(self._encode(sample, self._num_written))

    def write_records(self, records: Iterable[bytes]) -> None:
        """Add samples already encoded as this format's records (what :meth:`write` makes of them).

        For encoders that build many records at once (the distributed converters build
        them from Arrow columns); the shards come out as if each sample had been written.

        Raises:
            UsageError: the writer is already finished.
        """
        if self._finished:
            raise UsageError(f"{type(self).__name__}({self.local!r}) is finished; create a new writer to add samples")
        batch = records if isinstance(records, list) else list(records)
        if not self.size_limit:
            self._records.extend(batch)
            self._shard_size += sum(map(len, batch)) + self._sample_overhead * len(batch)
            self._num_written += len(batch)
            return
        sizes = np.fromiter(map(len, batch), np.int64, len(batch)) + self._sample_overhead
        start = 0
        while start < len(batch):
            # The records that still fit go in at once; the first that does not flushes the
            # shard and goes in alone (the rule of _add, so the same shards come out).
            total = np.cumsum(sizes[start:])
            fit = int(np.searchsorted(total, self.size_limit - self._shard_size, side="right"))
            if fit:
                self._records.extend(batch[start : start + fit])
                self._shard_size += int(total[fit - 1])
                self._num_written += fit
                start += fit
            if start < len(batch):
                self._add(batch[start])
                start += 1

    def _add(self, record: bytes) -> None:
        size = len(record) + self._sample_overhead
        # Same rule as MosaicML: flush first if this sample would overflow the shard, even
        # when the shard is still empty (which writes a 0-sample shard).
        if self.size_limit and self.size_limit < self._shard_size + size:
            self._flush()
        self._records.append(record)
        self._shard_size += size
        self._num_written += 1

    def finish(self) -> None:
        """Flush the last shard and write index.json. Idempotent."""
        if self._finished:
            return
        self._finished = True
        if self._records:
            self._flush()
        self._settle()
        path = os.path.join(self.local, INDEX_NAME)
        # Shard renames become durable here, before the index that makes them reachable.
        fsync_dir(self.local)
        atomic_write(path, Index(tuple(self._shards), path).dumps())
        self._after_index(path)

    def abort(self) -> None:
        """Stop without writing index.json (the finished shards stay on disk). Idempotent."""
        self._finished = True
        self._records = []
        pending, self._pending = self._pending, []
        for commit in pending:
            # Let the last shard land (it is complete); its error, if any, is not the story.
            with contextlib.suppress(OSError):
                commit.wait()

    def __enter__(self) -> Self:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        if exc_type is None:
            self.finish()
        else:
            # No index.json: a half-written dataset must not look complete.
            self.abort()

    def __del__(self) -> None:
        if getattr(self, "_finished", True) is False and getattr(self, "_num_written", 0) > 0:
            warnings.warn(
                f"{type(self).__name__}({self.local!r}) was never finished: call finish() or use it in a "
                "`with` block, or the dataset has no index.json",
                ResourceWarning,
                stacklevel=1,
            )

    # --- internals ----------------------------------------------------------------------

    def _prepare_dir(self, exist_ok: bool) -> None:
        if os.path.isdir(self.local) and os.listdir(self.local):
            if not exist_ok:
                raise OutputExistsError(
                    f"out={self.local!r} exists and is not empty; pass exist_ok=True to replace its contents"
                )
            # The old index goes first, so a crash in between never leaves it pointing at
            # a mix of old and new shards.
            index = os.path.join(self.local, INDEX_NAME)
            if os.path.exists(index):
                os.unlink(index)
            shutil.rmtree(self.local)
        try:
            os.makedirs(self.local, exist_ok=True)
        except OSError as exc:
            raise ConfigError(f"out={self.local!r}: cannot create the directory: {exc}") from exc

    def _file_info(self, basename: str, pieces: list[bytes]) -> FileInfo:
        digests = {}
        for algo in self.hashes:
            hasher = new_hasher(algo)
            for piece in pieces:
                hasher.update(piece)
            digests[algo] = hasher.hexdigest()
        return FileInfo(basename, sum(map(len, pieces)), digests)

    def _flush(self) -> None:
        position = len(self._shards)
        infos: list[tuple[FileInfo, FileInfo | None]] = []
        stored: list[tuple[str, list[bytes]]] = []
        for extra, pieces in self._shard_files(self._records):
            raw_name = ".".join(p for p in ("shard", f"{position:05}", self.format, extra) if p)
            raw_info = self._file_info(raw_name, pieces)
            zip_info = None
            name = raw_name
            if self._codec is not None:
                name = f"{raw_name}.{self._codec.extension}"
                pieces = [self._codec.compress(b"".join(pieces))]
                zip_info = self._file_info(name, pieces)
            infos.append((raw_info, zip_info))
            stored.append((name, pieces))
        self._settle()
        # The files are written now; their fsync and rename overlap with encoding the next shard.
        self._pending = [BackgroundCommit(os.path.join(self.local, name), pieces, self._durable_shards())
                         for name, pieces in stored]
        self._shards.append(self._shard_entry(position, len(self._records), infos))
        self._records = []
        self._shard_size = self._shard_overhead

    def _settle(self) -> None:
        """Wait for the previous shard to be durable and in place, then run the hook."""
        pending, self._pending = self._pending, []
        for commit in pending:
            commit.wait()
        if pending:
            self._after_shard([commit.path for commit in pending])


def config_bytes(config: Mapping[str, Any]) -> bytes:
    """A writer config as shard headers and meta files store it (sorted keys, UTF-8)."""
    return json.dumps(config, sort_keys=True).encode("utf-8")
