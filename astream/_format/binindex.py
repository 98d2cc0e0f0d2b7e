"""A compact, read-only, columnar form of ``index.json``: built once, memory-mapped by every
process of a node.

``index.json`` stays the interchange format (MosaicML reads it); at a million shards it is
~450 MB of JSON whose parse takes every process ~100 s and ~4 GB. This file holds the same
information as columns, so a process maps it in milliseconds and holds no Python object
per shard:

- ``samples``, ``bytes`` (raw data, zip data, raw meta, zip meta; ``-1`` for none): int64;
- ``names`` and ``hashes``: four strings per shard (the same four files), as offsets into
  one UTF-8 blob each (a file's hashes as a small JSON object);
- everything else of a shard entry (the writer's config, repeated per shard by MDS
  writers; a Parquet shard's source ranges) interned: ``config`` (int64 per shard) indexes
  a table of distinct JSON objects, itself offsets into a blob.

Layout: ``MAGIC``, a little-endian u32 version and u32 header length, the header (JSON:
shard count, the source stamp, each column's dtype, offset and length), the 8-byte aligned
columns, and the xxh3-64 of everything before it. :meth:`BinaryIndex.open` checks the
magic, version, length and checksum before it maps anything: a truncated, corrupt or
foreign file is an :class:`IndexFormatError`, never trusted. A shard's
:class:`~astream._format.index.ShardInfo` is rebuilt on demand through the same validator
``index.json`` goes through (:meth:`BinaryIndex.shard`).
"""

from __future__ import annotations

import json
import mmap
import os
import struct
from collections.abc import Iterator, Mapping, Sequence
from typing import Any, BinaryIO, overload

import numpy as np
import xxhash
from numpy.typing import NDArray

from astream._format.index import ShardInfo
from astream.errors import IndexFormatError

__all__ = ["FORMAT_VERSION", "MAGIC", "BinaryIndex", "ShardTable", "write_binary_index"]

MAGIC = b"ASTRIDX\x00"
FORMAT_VERSION = 1
_FILES = ("raw_data", "zip_data", "raw_meta", "zip_meta")
_PREFIX = struct.Struct("<8sII")
_CHECK = 8  # the trailing xxh3-64
_CHUNK = 1 << 24


def _hashes_text(hashes: Mapping[str, str]) -> str:
    return json.dumps(dict(hashes), separators=(",", ":")) if hashes else ""


def _blob(strings: Sequence[str]) -> tuple[NDArray[np.int64], bytes]:
    encoded = [s.encode("utf-8") for s in strings]
    offsets = np.zeros(len(encoded) + 1, np.int64)
    np.cumsum([len(e) for e in encoded], out=offsets[1:])
    return offsets, b"".join(encoded)


def write_binary_index(out: BinaryIO, shards: Sequence[dict[str, Any]] | Iterator[ShardInfo], num_shards: int,
                       stamp: Mapping[str, Any]) -> None:
    """Write the columns of validated shards to ``out`` (a file open for writing).

    Args:
        shards: the index's shards as :class:`ShardInfo` (already validated), in order.
        num_shards: how many.
        stamp: what identifies the ``index.json`` they come from (kept in the header).
    """
    samples = np.empty(num_shards, np.int64)
    sizes = np.full((num_shards, 4), -1, np.int64)
    names: list[str] = []
    hashes: list[str] = []
    config_ids = np.empty(num_shards, np.int64)
    configs: dict[str, int] = {}
    for i, info in enumerate(shards):
        assert isinstance(info, ShardInfo)
        obj = info.to_json()
        samples[i] = info.samples
        for k, key in enumerate(_FILES):
            f = getattr(info, key)
            names.append("" if f is None else f.basename)
            hashes.append("" if f is None else _hashes_text(f.hashes))
            if f is not None:
                sizes[i, k] = f.bytes
        rest = json.dumps({k: v for k, v in obj.items() if k not in (*_FILES, "samples")}, sort_keys=True)
        config_ids[i] = configs.setdefault(rest, len(configs))
    name_off, name_blob = _blob(names)
    hash_off, hash_blob = _blob(hashes)
    conf_off, conf_blob = _blob(list(configs))
    columns: list[tuple[str, np.ndarray[Any, Any] | bytes]] = [
        ("samples", samples), ("bytes", sizes.reshape(-1)), ("config", config_ids),
        ("name_offsets", name_off), ("names", name_blob), ("hash_offsets", hash_off), ("hashes", hash_blob),
        ("config_offsets", conf_off), ("configs", conf_blob),
    ]
    table: dict[str, list[Any]] = {}
    offset = 0
    for name, col in columns:
        raw = col if isinstance(col, bytes) else col.astype("<i8").tobytes()
        table[name] = ["u1" if isinstance(col, bytes) else "<i8", offset, len(raw)]
        offset += -(-len(raw) // 8) * 8
    header = json.dumps({"num_shards": num_shards, "stamp": dict(stamp), "columns": table}).encode()
    header += b" " * (-(_PREFIX.size + len(header)) % 8)
    digest = xxhash.xxh3_64()
    for part in (_PREFIX.pack(MAGIC, FORMAT_VERSION, len(header)), header):
        digest.update(part)
        out.write(part)
    for _, col in columns:
        raw = col if isinstance(col, bytes) else col.astype("<i8").tobytes()
        raw += b"\x00" * (-len(raw) % 8)
        digest.update(raw)
        out.write(raw)
    out.write(digest.digest())


class BinaryIndex:
    """A mapped binary index: its columns as read-only NumPy views of the file.

    Attributes:
        path: the file.
        num_shards: shards of the index.
        stamp: the header's identity of the ``index.json`` it was built from.
        samples: samples per shard (int64, mapped).
    """

    def __init__(self, path: str, source: str, mapped: mmap.mmap, header: dict[str, Any], start: int) -> None:
        self.path, self.source = path, source
        self._map = mapped
        self.num_shards = int(header["num_shards"])
        self.stamp: dict[str, Any] = header["stamp"]
        cols: dict[str, Any] = {}
        for name, (dtype, offset, length) in header["columns"].items():
            cols[name] = np.frombuffer(mapped, np.dtype(dtype), length // np.dtype(dtype).itemsize, start + offset)
        self._cols = cols
        self.samples: NDArray[np.int64] = cols["samples"]
        self._bytes: NDArray[np.int64] = cols["bytes"].reshape(self.num_shards, 4)
        if len(self.samples) != self.num_shards or len(cols["config_offsets"]) < 1:
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
            head = os.pread(fd, _PREFIX.size, 0)
            if len(head) < _PREFIX.size:
                raise bad(f"{size} bytes, too short to be one")
            magic, version, header_len = _PREFIX.unpack(head)
            if magic != MAGIC:
                raise bad("not an astream binary index (wrong magic)")
            if version != FORMAT_VERSION:
                raise bad(f"format version {version}, this astream reads {FORMAT_VERSION}")
            try:
                header = json.loads(os.pread(fd, header_len, _PREFIX.size))
                start = _PREFIX.size + header_len
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
        finally:
            os.close(fd)
        try:
            return cls(path, source, mapped, header, start)
        except (ValueError, KeyError, TypeError) as exc:
            raise bad(f"columns that do not fit the file ({exc})") from exc

    def _string(self, offsets: str, blob: str, k: int) -> str:
        off = self._cols[offsets]
        return bytes(self._cols[blob][int(off[k]) : int(off[k + 1])]).decode("utf-8")

    def raw_bytes(self) -> NDArray[np.int64]:
        """Each shard's raw data size in bytes (mapped)."""
        return self._bytes[:, 0]

    def entry(self, i: int) -> dict[str, Any]:
        """Shard ``i``'s entry as ``index.json`` holds it."""
        conf = int(self._cols["config"][i])
        obj: dict[str, Any] = json.loads(self._string("config_offsets", "configs", conf))
        obj["samples"] = int(self.samples[i])
        for k, key in enumerate(_FILES):
            size = int(self._bytes[i, k])
            if size < 0:
                if key in ("raw_data", "zip_data") or obj.get("format") not in ("mds", "webdataset", "parquet"):
                    obj[key] = None
                continue
            text = self._string("hash_offsets", "hashes", 4 * i + k)
            hashes = json.loads(text) if text else {}
            obj[key] = {"basename": self._string("name_offsets", "names", 4 * i + k), "bytes": size,
                        "hashes": hashes}
        return obj

    def shard(self, i: int) -> ShardInfo:
        """Shard ``i`` as a :class:`ShardInfo`, checked by index.json's validator.

        Raises:
            IndexError: no such shard.
            IndexFormatError: the entry is malformed (a binary index astream did not write).
        """
        if not 0 <= i < self.num_shards:
            raise IndexError(f"shard {i} of {self.num_shards}")
        return ShardInfo.from_json(self.entry(i), i, self.source)

    def close(self) -> None:
        self._cols.clear()
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

    @overload
    def __getitem__(self, i: int) -> ShardInfo: ...
    @overload
    def __getitem__(self, i: slice) -> Sequence[ShardInfo]: ...
    def __getitem__(self, i: int | slice) -> ShardInfo | Sequence[ShardInfo]:
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(len(self)))]
        if i < 0:
            i += len(self)
        got = self._recent.get(i)
        if got is None:
            if len(self._recent) >= self._keep:
                self._recent.pop(next(iter(self._recent)))
            got = self._recent[i] = self.binary.shard(i)
        return got
