"""A compact, read-only, columnar form of ``index.json``: built once, memory-mapped by every
process of a node.

``index.json`` stays the interchange format (MosaicML reads it); at a million shards it is
~450 MB of JSON whose parse takes every process ~100 s and ~4 GB. This file holds the same
information as columns, so a process maps it in milliseconds and holds no Python object
per shard:

- ``samples``; ``bytes``, column-major (raw data, zip data, raw meta, zip meta; ``-1`` for
  none: one file's sizes are contiguous, so summing them touches only their pages): int64;
- ``names`` and ``hashes``: four strings per shard (the same four files), as offsets into
  one UTF-8 blob each (a file's hashes as a small JSON object);
- everything else of a shard entry (the writer's config, repeated per shard by MDS
  writers; a Parquet shard's source ranges) interned: ``config`` (int64 per shard) indexes
  a table of distinct JSON objects (offsets into a blob), ``config_firsts`` the first shard
  of each;
- what the dataset hashes of every shard, worked out once here (:mod:`astream._format.columns`):
  ``identity`` (the JSON text of the shards' identities: the state's fingerprint and the
  stream's key), and in the header its xxh64, the xxh3-128 of the shards' views (the node
  agent's address) and the digests every data file carries.

Layout: ``MAGIC``, a little-endian u32 version and u32 header length, the header (JSON:
shard count, the source stamp, each column's dtype, offset and length, the digests), the
8-byte aligned columns, and the xxh3-64 of everything before it. :meth:`BinaryIndex.open`
checks the magic, version, length and checksum before it maps anything: a truncated,
corrupt or foreign file is an :class:`IndexFormatError`, never trusted. A shard's
:class:`~astream._format.index.ShardInfo` is made on demand (:meth:`BinaryIndex.shard`):
the first of each writer config through the same validator ``index.json`` goes through,
the others from it with their own files checked as that validator checks them.
"""

from __future__ import annotations

import dataclasses
import json
import mmap
import os
import weakref
from collections.abc import Iterator, Sequence
from typing import Any, overload

import numpy as np
import xxhash
from numpy.typing import NDArray

from astream._format.binindex_write import FILES, FORMAT_VERSION, MAGIC, PREFIX, write_binary_index
from astream._format.columns import IndexColumns
from astream._format.index import FileInfo, ShardInfo
from astream._format.names import unsafe_name
from astream.errors import IndexFormatError

__all__ = ["FORMAT_VERSION", "MAGIC", "BinaryIndex", "ShardTable", "write_binary_index"]

_CHECK = 8  # the trailing xxh3-64
_CHUNK = 1 << 24

# This process's open maps, by (file, checksum): a dataset unpickled in the process that
# maps the file already (a loader's stand-in workers, each epoch) takes that map, not one
# more (each holds a file descriptor until it is collected: two a loader, found by
# tests/dataset/test_epochs_leak.py).
_MAPPED: weakref.WeakValueDictionary[tuple[str, str], BinaryIndex] = weakref.WeakValueDictionary()


class BinaryIndex:
    """A mapped binary index: its columns as read-only NumPy views of the file.

    Attributes:
        path: the file.
        num_shards: shards of the index.
        stamp: the header's identity of the ``index.json`` it was built from.
        samples: samples per shard (int64, mapped).
    """

    def __init__(self, path: str, source: str, mapped: mmap.mmap, header: dict[str, Any], start: int,
                 checksum: str = "") -> None:
        self.path, self.source, self.checksum = path, source, checksum
        self.ident = (-1, -1)  # the mapped file's device and inode
        self._map = mapped
        self.num_shards = int(header["num_shards"])
        self.stamp: dict[str, Any] = header["stamp"]
        cols: dict[str, Any] = {}
        for name, (dtype, offset, length) in header["columns"].items():
            cols[name] = np.frombuffer(mapped, np.dtype(dtype), length // np.dtype(dtype).itemsize, start + offset)
        self._cols = cols
        self.samples: NDArray[np.int64] = cols["samples"]
        # Column-major: one file's sizes are contiguous, so reading them touches only theirs.
        self._bytes: NDArray[np.int64] = cols["bytes"].reshape(4, self.num_shards)
        self._columns: IndexColumns | None = None
        self._templates: dict[int, ShardInfo] = {}
        self._spans = {name: (start + int(offset), int(length)) for name, (_, offset, length)
                       in header["columns"].items()}
        self._header = header
        if len(self.samples) != self.num_shards or len(cols["config_offsets"]) < 1 or \
                len(cols["config"]) != self.num_shards:
            raise self._bad("its columns do not match its shard count")

    def _bad(self, what: str) -> IndexFormatError:
        return IndexFormatError(f"{self.path}: {what}; the binary index of {self.source} is corrupt "
                                "(delete it: it is rebuilt from index.json)")

    @classmethod
    def open(cls, path: str, source: str = "index.json") -> BinaryIndex:
        """Check and map the binary index at ``path`` (built from ``source``).

        Raises:
            IndexFormatError: not a binary index of this version, truncated, or its checksum
                does not match its bytes.
        """
        def bad(what: str) -> IndexFormatError:
            return IndexFormatError(f"{path}: {what}; the binary index of {source} is corrupt or stale "
                                    "(delete it: it is rebuilt from index.json)")

        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError as exc:
            raise IndexFormatError(f"{path}: cannot open the binary index of {source}: {exc}") from exc
        try:
            size = os.fstat(fd).st_size
            head = os.pread(fd, PREFIX.size, 0)
            if len(head) < PREFIX.size:
                raise bad(f"{size} bytes, too short to be one")
            magic, version, header_len = PREFIX.unpack(head)
            if magic != MAGIC:
                raise bad("not an astream binary index (wrong magic)")
            if version != FORMAT_VERSION:
                raise bad(f"format version {version}, this astream reads {FORMAT_VERSION}")
            try:
                header = json.loads(os.pread(fd, header_len, PREFIX.size))
                start = PREFIX.size + header_len
                body = max(int(o) + -(-int(n) // 8) * 8 for _, o, n in header["columns"].values())
            except (ValueError, KeyError, TypeError) as exc:
                raise bad(f"unreadable header ({exc})") from exc
            if size != start + body + _CHECK:
                raise bad(f"{size} bytes where its header says {start + body + _CHECK} (truncated?)")
            # The checksum is read through the file, not the map: checking it costs no RSS.
            digest = xxhash.xxh3_64()
            done = 0
            while done < size - _CHECK:
                chunk = os.pread(fd, min(_CHUNK, size - _CHECK - done), done)
                if not chunk:
                    raise bad("shorter than its size while read")
                digest.update(chunk)
                done += len(chunk)
            if os.pread(fd, _CHECK, size - _CHECK) != digest.digest():
                raise bad("its checksum does not match its bytes")
            mapped = mmap.mmap(fd, size, access=mmap.ACCESS_READ)
            st = os.fstat(fd)
        finally:
            os.close(fd)
        try:
            binary = cls(path, source, mapped, header, start, digest.hexdigest())
            binary.ident = (st.st_dev, st.st_ino)
        except (ValueError, KeyError, TypeError) as exc:
            raise bad(f"columns that do not fit the file ({exc})") from exc
        _MAPPED[(path, binary.checksum)] = binary
        return binary

    def _string(self, offsets: str, blob: str, k: int) -> str:
        off = self._cols[offsets]
        return bytes(self._cols[blob][int(off[k]) : int(off[k + 1])]).decode("utf-8")

    def raw_bytes(self) -> NDArray[np.int64]:
        """Each shard's raw data size in bytes (mapped)."""
        row: NDArray[np.int64] = self._bytes[0]
        return row

    def raw_files(self, i: int) -> list[tuple[str, int, str | None, int]]:
        """Shard ``i``'s files, meta first, as ``(name, bytes, compressed name or None, its
        bytes)`` (what a cache's scan stats), without making the shard."""
        out = []
        for k in (2, 0):
            size = int(self._bytes[k, i])
            if size >= 0:
                name = self._string("name_offsets", "names", 4 * i + k)
                zipped = int(self._bytes[k + 1, i])
                zname = self._string("name_offsets", "names", 4 * i + k + 1) if zipped >= 0 else None
                if any(unsafe_name(n, max_parts=2) is not None for n in (name, zname) if n is not None):
                    raise self._bad(f"shard {i} names an unsafe file")
                out.append((name, size, zname, zipped))
        return out

    def chunks(self, name: str) -> Iterator[bytes]:
        """Column ``name``'s bytes, read through the file, not the map: a process that only
        hashes a column (the identity, once) keeps none of its pages."""
        start, length = self._spans[name]
        fd = os.open(self.path, os.O_RDONLY)
        try:
            st = os.fstat(fd)
            if (st.st_dev, st.st_ino) != self.ident:  # (the very file mapped, not one rebuilt since)
                raise IndexFormatError(f"{self.path}: rebuilt while this process held the one before")
            done = 0
            while done < length:
                chunk = os.pread(fd, min(_CHUNK, length - done), start + done)
                if not chunk:
                    raise self._bad("shorter than its header says while read")
                yield chunk
                done += len(chunk)
        finally:
            os.close(fd)

    def columns(self) -> IndexColumns:
        """The per-shard facts the dataset reads (:mod:`astream._format.columns`); only the
        first shard of each writer config is made."""
        if self._columns is None:
            h = self._header
            firsts = self._cols["config_firsts"]
            self._columns = IndexColumns(
                self.samples, self._bytes, self._cols["config"], tuple(self._template(c) for c in range(len(firsts))),
                lambda: self.chunks("identity"), str(h["identity_xxh64"]), str(h["view_digest"]),
                frozenset(h["algos"]))
        return self._columns

    def entry(self, i: int) -> dict[str, Any]:
        """Shard ``i``'s entry as ``index.json`` holds it."""
        conf = int(self._cols["config"][i])
        obj: dict[str, Any] = json.loads(self._string("config_offsets", "configs", conf))
        obj["samples"] = int(self.samples[i])
        for k, key in enumerate(FILES):
            size = int(self._bytes[k, i])
            if size < 0:
                if key in ("raw_data", "zip_data") or obj.get("format") not in ("mds", "webdataset", "parquet"):
                    obj[key] = None
                continue
            text = self._string("hash_offsets", "hashes", 4 * i + k)
            hashes = json.loads(text) if text else {}
            obj[key] = {"basename": self._string("name_offsets", "names", 4 * i + k), "bytes": size,
                        "hashes": hashes}
        return obj

    def _template(self, conf: int) -> ShardInfo:
        """The first shard of writer config ``conf``, checked by index.json's validator (once)."""
        got = self._templates.get(conf)
        if got is None:
            first = int(self._cols["config_firsts"][conf])
            got = self._templates[conf] = ShardInfo.from_json(self.entry(first), first, self.source)
        return got

    def _file(self, i: int, k: int) -> FileInfo | bool | None:
        """File ``k`` of shard ``i`` (None: it has none; False: not what the validator passes)."""
        size = int(self._bytes[k, i])
        if size < 0:
            return None
        name = self._string("name_offsets", "names", 4 * i + k)
        text = self._string("hash_offsets", "hashes", 4 * i + k)
        hashes = json.loads(text) if text else {}
        if unsafe_name(name, max_parts=2) is not None or not isinstance(hashes, dict) or not all(
                isinstance(a, str) and isinstance(d, str) for a, d in hashes.items()):
            return False
        return FileInfo(name, size, hashes)

    def shard(self, i: int) -> ShardInfo:
        """Shard ``i`` as a :class:`ShardInfo`: its config's first shard went through
        index.json's validator, and this one's files must fit it (names, sizes, digests
        checked as the validator checks them), else it goes through the validator itself.

        Raises:
            IndexError: no such shard.
            IndexFormatError: the entry is malformed (a binary index astream did not write).
        """
        i = int(i)  # (a NumPy integer would become the shard's index)
        if not 0 <= i < self.num_shards:
            raise IndexError(f"shard {i} of {self.num_shards}")
        t = self._template(int(self._cols["config"][i]))
        if t.index == i:
            return t
        files = [self._file(i, k) for k in range(4)]
        like = [f is None for f in files] == [f is None for f in (t.raw_data, t.zip_data, t.raw_meta, t.zip_meta)]
        if t.source is not None or not like or any(f is False for f in files):
            return ShardInfo.from_json(self.entry(i), i, self.source)
        raw, zipped, raw_meta, zip_meta = (f if isinstance(f, FileInfo) else None for f in files)
        assert raw is not None
        return dataclasses.replace(t, index=i, samples=int(self.samples[i]), raw_data=raw, zip_data=zipped,
                                   raw_meta=raw_meta, zip_meta=zip_meta)

    @property
    def closed(self) -> bool:
        return self._map.closed

    def close(self) -> None:
        self._cols.clear()
        self._columns = None
        self._templates.clear()
        self.samples = self._bytes = np.zeros(0, np.int64)  # drop the views before the map
        self._map.close()


class ShardTable(Sequence[ShardInfo]):
    """An index's shards, made one at a time from a :class:`BinaryIndex` (the last few kept)."""

    def __init__(self, binary: BinaryIndex, keep: int = 1024) -> None:
        self.binary = binary
        self._recent: dict[int, ShardInfo] = {}
        self._keep = keep

    def __len__(self) -> int:
        return self.binary.num_shards

    @property
    def samples(self) -> NDArray[np.int64]:
        """Samples per shard (the mapped column)."""
        return self.binary.samples

    def raw_files(self, i: int) -> list[tuple[str, int, str | None, int]]:
        """Shard ``i``'s files, no shard made (:meth:`BinaryIndex.raw_files`)."""
        return self.binary.raw_files(i)

    def columns(self) -> IndexColumns:
        """The index's per-shard facts, from the map (see :func:`~astream._format.columns.columns_of`)."""
        return self.binary.columns()

    def __iter__(self) -> Iterator[ShardInfo]:
        # (a walk over every shard: made and let go, not kept among the recent ones)
        return (self.binary.shard(i) for i in range(len(self)))

    def __eq__(self, other: object) -> bool:  # (as the tuple of shards it stands for compares)
        if isinstance(other, ShardTable) and other.binary.checksum == self.binary.checksum:
            return True
        return isinstance(other, Sequence) and len(other) == len(self) and all(
            a == b for a, b in zip(self, other, strict=True))

    __hash__ = None  # type: ignore[assignment]

    def __reduce__(self) -> tuple[Any, ...]:
        # Pickled (to the node agent's process, a loader's workers) as where the file is:
        # the other process maps the same file, checked to be the very one mapped here.
        b = self.binary
        return (_reopen, (b.path, b.source, b.checksum, self._keep))

    @overload
    def __getitem__(self, i: int) -> ShardInfo: ...
    @overload
    def __getitem__(self, i: slice) -> Sequence[ShardInfo]: ...
    def __getitem__(self, i: int | slice) -> ShardInfo | Sequence[ShardInfo]:
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(len(self)))]
        i = int(i)
        if i < 0:
            i += len(self)
        got = self._recent.get(i)
        if got is None:
            if len(self._recent) >= self._keep:
                self._recent.pop(next(iter(self._recent)))
            got = self._recent[i] = self.binary.shard(i)
        return got


def _reopen(path: str, source: str, checksum: str, keep: int) -> ShardTable:
    mapped = _MAPPED.get((path, checksum))
    if mapped is not None and not mapped.closed:
        return ShardTable(mapped, keep)
    binary = BinaryIndex.open(path, source)
    if binary.checksum != checksum:
        binary.close()
        raise IndexFormatError(f"{path}: the binary index of {source} was rebuilt (index.json changed) while "
                               "a process of this dataset held the one before; make the dataset again")
    return ShardTable(binary, keep)
