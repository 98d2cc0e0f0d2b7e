"""WebDataset shards: tar files (plain or gzip-compressed) whose members are grouped into
samples by key.

A member ``dir/000123.seg.jpg`` belongs to the sample with key ``dir/000123`` under the
extension ``seg.jpg`` (the key is the path up to the first dot of its last component, as
WebDataset splits it); consecutive members with one key form one sample, returned as a
dict of extension -> bytes plus ``__key__``, decoding left to a ``transform``. The index
of a tar is built by scanning its headers once (:func:`scan_tar`); the reader scans the
cached file's headers again when it opens it and checks the count against the index
(:mod:`astream._format.tar` reads a header in ~1 µs, cheap next to reading the members).
"""

from __future__ import annotations

import contextlib
import mmap
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import IO, Any

import numpy as np
import numpy.typing as npt

from astream._format.compression import StreamDecoder, get_codec
from astream._format.index import ShardInfo
from astream._format.shard import map_file, out_of_range
from astream._format.tar import Member, TarStream, tar_members
from astream.errors import CompressionError, IndexFormatError, ShardFormatError

__all__ = ["GZ_SUFFIXES", "KEY", "TAR_SUFFIXES", "TarLayout", "TarReader", "TarSummary", "declared_tar_bytes", "scan_tar",
           "split_name", "tar_entry"]

TAR_SUFFIXES = (".tar", ".tar.gz", ".tgz")
GZ_SUFFIXES = (".gz", ".tgz")
KEY = "__key__"
# A tar whose largest member is over this many bytes and holds few samples warns.
BIG_MEMBER = 256 << 20
_GZ = get_codec("gz")
_READ = 1 << 20


def split_name(name: str) -> tuple[str, str]:
    """``dir/000123.seg.jpg`` -> ``("dir/000123", "seg.jpg")``."""
    folder, _, base = name.rpartition("/")
    stem, _, ext = base.partition(".")
    return (f"{folder}/{stem}" if folder else stem), ext


@dataclass(frozen=True)
class Sample:
    key: str
    members: tuple[tuple[str, int, int], ...]  # (extension, data offset, size)


def _samples(members: list[Member]) -> list[Sample]:
    out: list[Sample] = []
    key: str | None = None
    grouped: list[tuple[str, int, int]] = []
    for member, offset, size in members:
        k, ext = split_name(member)
        if k != key:
            if key is not None:
                out.append(Sample(key, tuple(grouped)))
            key, grouped = k, []
        grouped.append((ext, offset, size))
    if key is not None:
        out.append(Sample(key, tuple(grouped)))
    return out


@dataclass(frozen=True)
class TarSummary:
    """What the index records of one tar: its samples, extensions, largest member, and
    its size as a tar (decompressed, for a gzip one: what reading it may cost)."""

    samples: int
    extensions: tuple[str, ...]
    largest: int
    tar_bytes: int


def scan_tar(path: str, name: str) -> TarSummary:
    """Scan the headers of the tar at ``path`` (``name`` for messages; gzip by its suffix).

    A gzip tar is decompressed as a stream, in windows, keeping only its headers: a member
    of any size costs no memory.

    Raises:
        ShardFormatError: not a tar (or not gzip when named so).
    """
    with open(path, "rb") as fh:
        if _gzipped(name):
            stream = TarStream(name)
            decoder = StreamDecoder(_GZ, stream.feed, limit=None, name=name)
            try:
                while chunk := fh.read(_READ):
                    decoder.decode(chunk)
                decoder.flush()
            except CompressionError as exc:
                raise ShardFormatError(f"{name}: not gzip, or a truncated one ({exc})") from exc
            members, tar_bytes = stream.members(), stream.total
        else:
            with _mapped(fh, name) as buf:
                members, tar_bytes = tar_members(buf, name), len(buf)
    samples = _samples(members)
    exts = sorted({ext for s in samples for ext, _, _ in s.members})
    largest = max((size for s in samples for _, _, size in s.members), default=0)
    return TarSummary(len(samples), tuple(exts), largest, tar_bytes)


def _gzipped(name: str) -> bool:
    return name.endswith(GZ_SUFFIXES)


def declared_tar_bytes(info: ShardInfo, source: str) -> int:
    """The size of a shard's tar as its index records it (a gzip one decodes to it).

    Raises:
        IndexFormatError: the index has no valid size (written by an older ``astream index``).
    """
    meta = info.config.get("webdataset")
    value = meta.get("tar_bytes") if isinstance(meta, dict) else None
    if isinstance(value, bool) or not isinstance(value, int) or value < 0:
        raise IndexFormatError(f"{source}: shard {info.index} ({info.raw_data.basename}): the index records no "
                               f"valid tar_bytes ({value!r}); rebuild it with `astream index`")
    return value


@contextlib.contextmanager
def _mapped(fh: IO[bytes], name: str) -> Iterator[bytes | mmap.mmap]:
    """The whole file, mapped (an empty one as ``b""``: it cannot be mapped)."""
    if os.fstat(fh.fileno()).st_size == 0:
        yield b""
        return
    with mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ) as buf:
        yield buf


class TarLayout:
    """The extensions (columns) of a WebDataset stream."""

    def __init__(self, info: ShardInfo, source: str) -> None:
        if any(spec != "bytes" for spec in info.column_encodings):
            raise IndexFormatError(f"{source}: shard {info.index}: webdataset columns are bytes, "
                                   f"got {info.column_encodings}")
        self.names = info.column_names
        self.specs = info.column_encodings

    def same_columns(self, other: object) -> bool:
        return isinstance(other, TarLayout) and (self.names, self.specs) == (other.names, other.specs)


class TarReader:
    """Random access to the samples of one cached tar (gzip ones are decompressed in memory,
    at most to the size the index declares).

    Raises:
        IndexFormatError: a gzip tar whose index records no decompressed size.
        ShardFormatError: not a tar, a gzip tar that decodes to another size than the
            index's, or a sample count that differs from the index.
    """

    def __init__(self, path: str, layout: TarLayout, info: ShardInfo) -> None:
        self.layout = layout
        self.name = path
        self.shard = info.index
        gzipped = _gzipped(info.raw_data.basename)
        size = declared_tar_bytes(info, path) if gzipped else 0
        mapped = map_file(path, info.index)
        self._buf: bytes | bytearray | mmap.mmap = mapped
        try:
            if gzipped:
                # In bounded steps that stop at the size the index declares (a bomb costs that).
                where = f"{path} (shard {info.index})"
                try:
                    self._buf = _GZ.decompress(mapped, size=size, name=where)
                except CompressionError as exc:
                    raise ShardFormatError(f"{exc}; the file changed or is hostile: rebuild the index") from exc
                mapped.close()
            self._samples = _samples(tar_members(self._buf, path))
        except BaseException:
            self.close()
            raise
        if len(self._samples) != info.samples:
            self.close()
            raise ShardFormatError(f"{path} (shard {info.index}): {len(self._samples)} samples, the index says "
                                   f"{info.samples}; the file changed: rebuild the index")
        self.num_samples = info.samples
        self.decoded_bytes = 0 if isinstance(self._buf, mmap.mmap) else len(self._buf)

    @property
    def buffer(self) -> bytes | bytearray | mmap.mmap:
        return self._buf

    def _check(self, index: int) -> int:
        if not -self.num_samples <= index < self.num_samples:
            raise out_of_range(f"{self.name} (shard {self.shard})", index, self.num_samples)
        return index % self.num_samples if index < 0 else index

    def get(self, index: int) -> dict[str, Any]:
        sample = self._samples[self._check(index)]
        out: dict[str, Any] = {KEY: sample.key}
        for ext, offset, size in sample.members:
            out[ext] = bytes(self._buf[offset : offset + size])
        return out

    def get_batch(self, ids: Sequence[int] | npt.NDArray[np.integer[Any]]) -> dict[str, Any]:
        samples = [self.get(int(i)) for i in np.asarray(ids, np.int64).reshape(-1)]
        return {name: [s.get(name) for s in samples] for name in (KEY, *self.layout.names)}

    def close(self) -> None:
        buf = self._buf
        if isinstance(buf, mmap.mmap):
            with contextlib.suppress(BufferError):  # a view still holds it
                buf.close()


def tar_entry(name: str, size: int, etag: str | None, summary: TarSummary, columns: Sequence[str]) -> dict[str, Any]:
    """The index.json entry of one tar."""
    return {"version": 2, "format": "webdataset", "samples": summary.samples, "compression": None, "hashes": [],
            "size_limit": None, "column_names": list(columns), "column_encodings": ["bytes"] * len(columns),
            "raw_data": {"basename": name, "bytes": size, "hashes": {}}, "zip_data": None,
            "webdataset": {"etag": etag, "extensions": list(summary.extensions), "largest": summary.largest,
                           "tar_bytes": summary.tar_bytes}}


