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
import gzip
import mmap
import os
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import IO, Any

import numpy as np
import numpy.typing as npt

from astream._format.index import ShardInfo
from astream._format.shard import map_file, out_of_range
from astream._format.tar import Buffer, tar_members
from astream.errors import IndexFormatError, ShardFormatError

__all__ = ["KEY", "TAR_SUFFIXES", "TarLayout", "TarReader", "TarSummary", "scan_tar", "split_name", "tar_entry"]

TAR_SUFFIXES = (".tar", ".tar.gz", ".tgz")
KEY = "__key__"
# A tar whose largest member is over this many bytes and holds few samples warns.
BIG_MEMBER = 256 << 20


def split_name(name: str) -> tuple[str, str]:
    """``dir/000123.seg.jpg`` -> ``("dir/000123", "seg.jpg")``."""
    folder, _, base = name.rpartition("/")
    stem, _, ext = base.partition(".")
    return (f"{folder}/{stem}" if folder else stem), ext


@dataclass(frozen=True)
class Sample:
    key: str
    members: tuple[tuple[str, int, int], ...]  # (extension, data offset, size)


def _samples(buf: Buffer, name: str) -> list[Sample]:
    out: list[Sample] = []
    key: str | None = None
    members: list[tuple[str, int, int]] = []
    for member, offset, size in tar_members(buf, name):
        k, ext = split_name(member)
        if k != key:
            if key is not None:
                out.append(Sample(key, tuple(members)))
            key, members = k, []
        members.append((ext, offset, size))
    if key is not None:
        out.append(Sample(key, tuple(members)))
    return out


@dataclass(frozen=True)
class TarSummary:
    """What the index records of one tar: its samples, extensions and largest member."""

    samples: int
    extensions: tuple[str, ...]
    largest: int


def scan_tar(path: str, name: str) -> TarSummary:
    """Scan the headers of the tar at ``path`` (``name`` for messages; gzip by its suffix).

    Raises:
        ShardFormatError: not a tar (or not gzip when named so).
    """
    with open(path, "rb") as fh:
        if _gzipped(name):
            samples = _samples(_gunzip(fh.read(), name), name)
        else:
            with _mapped(fh, name) as buf:
                samples = _samples(buf, name)
    exts = sorted({ext for s in samples for ext, _, _ in s.members})
    largest = max((size for s in samples for _, _, size in s.members), default=0)
    return TarSummary(len(samples), tuple(exts), largest)


def _gzipped(name: str) -> bool:
    return name.endswith((".gz", ".tgz"))


def _gunzip(data: bytes | mmap.mmap, name: str) -> bytes:
    try:
        return gzip.decompress(data)
    except (OSError, EOFError) as exc:
        raise ShardFormatError(f"{name}: not gzip, or a truncated one ({exc})") from exc


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
    """Random access to the samples of one cached tar (gzip ones are decompressed in memory).

    Raises:
        ShardFormatError: not a tar, or a sample count that differs from the index.
    """

    def __init__(self, path: str, layout: TarLayout, info: ShardInfo) -> None:
        self.layout = layout
        self.name = path
        self.shard = info.index
        mapped = map_file(path, info.index)
        self._buf: bytes | mmap.mmap = mapped
        try:
            if _gzipped(info.raw_data.basename):
                self._buf = _gunzip(mapped, f"{path} (shard {info.index})")
                mapped.close()
            self._samples = _samples(self._buf, path)
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
            "webdataset": {"etag": etag, "extensions": list(summary.extensions), "largest": summary.largest}}


