"""Reading one cached row group: its projected column chunks and its file's footer.

The cached file is the source ranges of the shard's index entry, back to back; the last
range is the Parquet file's footer. pyarrow reads the row group through a file object
that maps the original file's offsets onto the cached bytes (it only ever asks for the
column chunks the footer points to), decodes it once, and samples and batches are then
taken from the decoded columns: numbers as NumPy arrays and scalars, strings and bytes
as Python values, lists of numbers as arrays (see :func:`~astream._format.parquet.build.column_kind`).
"""

from __future__ import annotations

import bisect
import contextlib
import io
import mmap
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from astream._format.index import ShardInfo
from astream._format.parquet.footer import pyarrow
from astream._format.shard import map_file, out_of_range
from astream.errors import IndexFormatError, ShardFormatError

__all__ = ["ParquetLayout", "RowGroupReader"]

_KINDS = ("array", "scalars", "fixed", "ndarray", "str", "bytes", "object")


class ParquetLayout:
    """The projected columns of a row-group shard and how each comes out."""

    def __init__(self, info: ShardInfo, source: str) -> None:
        where = f"{source}: shard {info.index} ({info.raw_data.basename})"
        extra = info.config.get("parquet")
        if not isinstance(extra, dict) or info.source is None:
            raise IndexFormatError(f"{where}: a parquet shard needs its 'parquet' and 'source' entries")
        kinds = extra.get("kinds")
        row_group = extra.get("row_group")
        if not isinstance(kinds, list) or len(kinds) != len(info.column_names) or not all(k in _KINDS for k in kinds):
            raise IndexFormatError(f"{where}: parquet.kinds must give one of {_KINDS} per column, got {kinds!r}")
        if not isinstance(row_group, int) or isinstance(row_group, bool) or row_group < 0:
            raise IndexFormatError(f"{where}: parquet.row_group must be a non-negative integer, got {row_group!r}")
        self.names = info.column_names
        self.specs = info.column_encodings
        self.kinds: tuple[str, ...] = tuple(kinds)
        self.row_group = row_group

    def same_columns(self, other: object) -> bool:
        return isinstance(other, ParquetLayout) and (self.names, self.specs) == (other.names, other.specs)


class _Mapped(io.RawIOBase):
    """The original Parquet file, as far as the cached ranges hold it (zeros elsewhere)."""

    def __init__(self, buf: mmap.mmap | bytes, ranges: Sequence[tuple[int, int]], size: int) -> None:
        self._buf = memoryview(buf)
        self._starts = [a for a, _ in ranges]
        self._ranges = list(ranges)
        local = 0
        self._local: list[int] = []
        for a, b in ranges:
            self._local.append(local)
            local += b - a
        self._size = size
        self._pos = 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def tell(self) -> int:
        return self._pos

    def seek(self, offset: int, whence: int = 0) -> int:
        base = {0: 0, 1: self._pos, 2: self._size}[whence]
        self._pos = base + offset
        return self._pos

    def readinto(self, out: Any) -> int:
        view = memoryview(out).cast("B")
        n = min(len(view), max(0, self._size - self._pos))
        pos, stop = self._pos, self._pos + n
        filled = pos  # up to where ``view`` holds the file's bytes (or the zeros of a gap)
        k = max(0, bisect.bisect_right(self._starts, pos) - 1)
        while k < len(self._ranges) and self._ranges[k][0] < stop:
            a, b = self._ranges[k]
            lo, hi = max(a, pos), min(b, stop)
            if lo < hi:
                if lo > filled:
                    view[filled - pos : lo - pos] = bytes(lo - filled)
                src = self._local[k] + lo - a
                view[lo - pos : hi - pos] = self._buf[src : src + hi - lo]
                filled = hi
            k += 1
        if stop > filled:
            view[filled - pos : n] = bytes(stop - filled)
        self._pos = stop
        return n

    def close(self) -> None:
        self._buf.release()
        super().close()


class _Column:
    """One decoded column of a row group."""

    def __init__(self, kind: str, arr: Any) -> None:
        pa, _ = pyarrow()
        self.kind = kind
        self._arr = arr
        self._np: np.ndarray | None = None
        self._offsets: npt.NDArray[np.int64] | None = None
        self._valid: np.ndarray | None = None
        if kind == "array":
            self._np = arr.to_numpy(zero_copy_only=False)
        elif kind == "fixed":
            self._np = arr.flatten().to_numpy(zero_copy_only=False).reshape(len(arr), arr.type.list_size)
        elif kind == "ndarray":
            if hasattr(arr, "offsets") and arr.values.null_count == 0:  # (a fixed-size list has none)
                self._np = arr.values.to_numpy(zero_copy_only=False)
                self._offsets = np.asarray(arr.offsets.to_numpy(zero_copy_only=False), np.int64)
                self._valid = arr.is_valid().to_numpy(zero_copy_only=False)
        elif kind == "scalars":
            self._dtype = np.dtype(pa.array([], arr.type).to_numpy(zero_copy_only=False).dtype)

    def at(self, i: int) -> Any:
        if self._np is not None and self.kind in ("array", "fixed"):
            return self._np[i]
        if self.kind == "ndarray" and self._np is not None and self._offsets is not None and self._valid is not None:
            return self._np[self._offsets[i] : self._offsets[i + 1]] if self._valid[i] else None
        value = self._arr[i].as_py()
        if self.kind == "scalars":
            return None if value is None else self._dtype.type(value)
        if self.kind == "ndarray" and value is not None:
            return np.asarray(value, dtype=object if None in value else None)
        return value

    def take(self, idx: npt.NDArray[np.int64]) -> Any:
        if self._np is not None and self.kind in ("array", "fixed"):
            return self._np[idx]
        if self.kind in ("str", "bytes", "object"):
            pa, _ = pyarrow()
            return self._arr.take(pa.array(idx)).to_pylist()
        return [self.at(int(i)) for i in idx]

    def run(self, start: int, stop: int) -> Any:
        """Rows ``start`` to ``stop``: what :meth:`take` of that range gives, without the gather."""
        if self._np is not None and self.kind in ("array", "fixed"):
            return self._np[start:stop].copy()  # a batch never shares memory with the row group
        if self.kind in ("str", "bytes", "object"):
            return self._arr.slice(start, stop - start).to_pylist()
        return [self.at(i) for i in range(start, stop)]


class RowGroupReader:
    """Random access to the rows of one cached row group.

    Args:
        path: the cached file (the shard's source ranges back to back).
        layout: the shard's projected columns.
        info: the shard's index entry (its ranges and the source file's size).
        data: that file's bytes, read already (then ``path`` only names them in messages).
        threads: decode the columns on pyarrow's threads (off: on the calling thread only,
            leaving the other cores to work going on beside it).

    Raises:
        ShardFormatError: the cached file has the wrong size or does not decode.
    """

    def __init__(self, path: str, layout: ParquetLayout, info: ShardInfo, data: bytes | None = None,
                 threads: bool = True) -> None:
        _, pq = pyarrow()
        assert info.source is not None
        self.layout = layout
        self.name = path
        self.shard = info.index
        source = info.source
        self._buf: mmap.mmap | bytes = map_file(path, info.index) if data is None else data
        self._columns: list[_Column] = []
        where = f"{path} (shard {info.index}: {source.file} row group {layout.row_group})"
        try:
            if len(self._buf) != source.nbytes:
                raise ShardFormatError(f"{where}: {len(self._buf)} bytes, the index says {source.nbytes}; "
                                       "delete it so it is fetched again")
            footer_len = source.ranges[-1][1] - source.ranges[-1][0]
            footer = bytes(self._buf[len(self._buf) - footer_len :])
            try:
                meta = pq.read_metadata(_pa_buffer(footer))
                file = pq.ParquetFile(_Mapped(self._buf, source.ranges, source.file_bytes), metadata=meta,
                                      pre_buffer=False)
                table = file.read_row_group(layout.row_group, columns=list(layout.names), use_threads=threads)
            except Exception as exc:  # pyarrow's errors (ArrowInvalid, OSError) name no file
                raise ShardFormatError(f"{where}: does not decode ({type(exc).__name__}: {exc}); delete it so "
                                       "it is fetched again") from exc
            if table.num_rows != info.samples:
                raise ShardFormatError(f"{where}: {table.num_rows} rows, the index says {info.samples}")
            self._columns = [_Column(kind, table.column(name).combine_chunks())
                             for name, kind in zip(layout.names, layout.kinds, strict=True)]
            self.num_samples = info.samples
            self.decoded_bytes = int(table.nbytes)
        finally:
            # The decoded columns are pyarrow's own copies: the cached bytes are not needed now.
            self._release_buffer()

    @property
    def buffer(self) -> bytes | bytearray | mmap.mmap:
        return self._buf

    def __len__(self) -> int:
        return self.num_samples

    def _check(self, index: int) -> int:
        if not -self.num_samples <= index < self.num_samples:
            raise out_of_range(f"{self.name} (shard {self.shard})", index, self.num_samples)
        return index % self.num_samples if index < 0 else index

    def get(self, index: int) -> dict[str, Any]:
        i = self._check(index)
        return {name: col.at(i) for name, col in zip(self.layout.names, self._columns, strict=True)}

    def get_batch(self, ids: Sequence[int] | npt.NDArray[np.integer[Any]]) -> dict[str, Any]:
        idx = np.asarray(ids, dtype=np.int64).reshape(-1)
        n = self.num_samples
        if idx.size > 1 and idx[0] >= 0 and idx[-1] < n and idx[-1] - idx[0] == idx.size - 1 \
                and bool((np.diff(idx) == 1).all()):
            # A run of consecutive rows (an unshuffled epoch's batches): sliced, not gathered
            # (pyarrow's take is most of a string column's cost).
            start, stop = int(idx[0]), int(idx[-1]) + 1
            return {name: col.run(start, stop) for name, col in zip(self.layout.names, self._columns, strict=True)}
        if idx.size and (idx.min() < -n or idx.max() >= n):
            raise out_of_range(f"{self.name} (shard {self.shard})", int(idx[(idx < -n) | (idx >= n)][0]), n)
        idx = np.where(idx < 0, idx + n, idx)
        return {name: col.take(idx) for name, col in zip(self.layout.names, self._columns, strict=True)}

    def _release_buffer(self) -> None:
        buf = self._buf
        if isinstance(buf, mmap.mmap):
            with contextlib.suppress(BufferError):  # a view still holds it; the map goes with the view
                buf.close()

    def close(self) -> None:
        self._columns = []
        self._release_buffer()


def _pa_buffer(data: bytes) -> Any:
    pa, _ = pyarrow()
    return pa.BufferReader(data)
