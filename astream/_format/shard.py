"""Reading one MDS shard from ``bytes`` or an ``mmap``.

The shard layout is: uint32 ``n``, ``n + 1`` uint32 absolute offsets, the writer's
config as JSON, then the records (see docs/format.md). :class:`ShardReader` checks
the whole offset table, and every record's head, once when it opens (vectorised with
NumPy), so reading a sample afterwards cannot run off the buffer. ``get_batch``
gathers fixed-size columns for many samples at once: with NumPy fancy indexing over a
strided view when every column is fixed, and with vectorised offset arithmetic when
some are not.
"""

from __future__ import annotations

import mmap
import os
import struct
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from astream._format.encodings import Encoding
from astream._format.record import RecordLayout
from astream.errors import AstreamError, EncodingError, SampleIndexError, ShardFormatError, UsageError

__all__ = ["ShardReader", "decode_rows", "map_file", "out_of_range"]

_U32 = np.dtype("<u4")
_OFFSET = struct.Struct("<I")
# Gathering more bytes than this with one index array costs more memory than a loop.
_GATHER_LIMIT = 1 << 18
# Records at least this long are copied row by row (see ShardReader.copy_rows).
_ROW_LOOP_BYTES = 1 << 12
# Heads are validated this many samples at a time, to bound the temporary index arrays.
# Records whose heads are checked together, on first access to any of them.
_HEAD_CHUNK = 4096


def out_of_range(what: str, index: int, size: int) -> AstreamError:
    """The error for a sample index outside ``[-size, size)``."""
    return SampleIndexError(f"{what}: sample index {index} is out of range for {size} samples")


def map_file(path: str | os.PathLike[str], shard: int = 0) -> mmap.mmap:
    """Map a whole shard file read-only.

    Raises:
        ShardFormatError: the file is missing, unreadable or empty.
    """
    name = os.fspath(path)
    try:
        with open(path, "rb") as fh:
            if os.fstat(fh.fileno()).st_size == 0:
                raise ShardFormatError(f"{name} (shard {shard}): the file is empty; delete it so it is fetched again")
            return mmap.mmap(fh.fileno(), 0, access=mmap.ACCESS_READ)
    except OSError as exc:
        raise ShardFormatError(f"{name} (shard {shard}): cannot open the shard file: {exc}") from exc


def _read_u32(u8: npt.NDArray[np.uint8], positions: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
    """The little-endian uint32 at each byte position (positions need not be aligned)."""
    idx = positions[..., None] + np.arange(4)
    quads = np.ascontiguousarray(u8[idx])
    return quads.view(_U32)[..., 0].astype(np.int64)


class ShardReader:
    """Random access to the samples of one MDS shard.

    Args:
        buf: the whole uncompressed shard (``bytes``, ``bytearray`` or ``mmap``).
        layout: the shard's columns, usually ``RecordLayout.from_shard(info, ...)``.
        name: the file name, for error messages.
        shard: the shard's position in index.json, for error messages.
        expected_samples: the sample count index.json records (checked), or None.

    Raises:
        ShardFormatError: the buffer is truncated or its offsets/heads are inconsistent.
    """

    def __init__(
        self,
        buf: bytes | bytearray | mmap.mmap,
        layout: RecordLayout,
        *,
        name: str = "<shard>",
        shard: int = 0,
        expected_samples: int | None = None,
    ) -> None:
        self.layout = layout
        self.name = name
        self.shard = shard
        self._buf = buf
        self._view = memoryview(buf)
        self._u8: npt.NDArray[np.uint8] = np.frombuffer(buf, np.uint8)
        self._region: npt.NDArray[np.uint8] | None = None
        self._heads: npt.NDArray[np.int64] | None = None  # filled a chunk at a time (_check_heads)
        self._checked = bytearray()  # per chunk of _HEAD_CHUNK records: heads read and checked
        self._lengths: npt.NDArray[np.int64] = np.zeros(0, np.int64)
        try:
            self.num_samples, self._offsets = self._validate(expected_samples)
        except BaseException:
            self.close()
            raise

    @classmethod
    def open(
        cls, path: str | os.PathLike[str], layout: RecordLayout, *, shard: int = 0,
        expected_samples: int | None = None,
    ) -> ShardReader:
        """Map the shard file at ``path`` read-only and validate it.

        Raises:
            ShardFormatError: the file is missing, empty, truncated or inconsistent.
        """
        mapped = map_file(path, shard)
        return cls(mapped, layout, name=os.fspath(path), shard=shard, expected_samples=expected_samples)

    def _fail(self, what: str, sample: int | None = None) -> ShardFormatError:
        where = f"{self.name} (shard {self.shard})" + ("" if sample is None else f", sample {sample}")
        return ShardFormatError(f"{where}: {what}; the file is corrupt or truncated: delete it so it is fetched again")

    def _validate(self, expected: int | None) -> tuple[int, npt.NDArray[np.int64]]:
        size = len(self._u8)
        if size < 4:
            raise self._fail(f"{size} bytes cannot hold an MDS shard header")
        (n,) = _OFFSET.unpack_from(self._view, 0)
        if expected is not None and n != expected:
            raise self._fail(f"the shard holds {n} samples but index.json says {expected}")
        header_end = 4 + 4 * (n + 1)
        if header_end > size:
            raise self._fail(f"{n} samples need a {header_end}-byte offset table, the file has {size} bytes")
        offsets = np.frombuffer(self._buf, _U32, n + 1, 4).astype(np.int64)
        if offsets[0] < header_end:
            raise self._fail(f"the first sample starts at byte {offsets[0]}, inside the header", 0)
        lengths = np.diff(offsets)
        bad = np.flatnonzero(lengths < 0)
        if bad.size:
            raise self._fail(f"offsets go backwards ({offsets[bad[0]]} then {offsets[bad[0] + 1]})", int(bad[0]))
        if offsets[-1] > size:
            k = int(np.argmax(offsets > size))  # offsets[k] is the end of sample k - 1
            raise self._fail(f"the sample ends at byte {offsets[k]}, past the end of the {size}-byte file", max(k - 1, 0))
        layout = self.layout
        if layout.num_var == 0:
            bad = np.flatnonzero(lengths != layout.fixed_size)
            if bad.size:
                k = int(bad[0])
                raise self._fail(f"the record has {lengths[k]} bytes, its fixed-size columns need {layout.fixed_size}", k)
            if n:
                # Records are back to back and equally long: one strided 2-D view.
                self._region = self._u8[offsets[0] : offsets[-1]].reshape(n, layout.fixed_size)
        else:
            short = np.flatnonzero(lengths < 4 * layout.num_var + layout.fixed_size)
            if short.size:
                k = int(short[0])
                raise self._fail(f"the record has {lengths[k]} bytes, too few for its head and fixed-size columns", k)
            # Heads are read and checked against the offsets a chunk of records at a time,
            # on first access: reading them all at open touched every page of the shard
            # (17-36 ms and ~64 MB of RSS for a 64 MB shard of 1 KB records) before the
            # first sample. No record is decoded before its chunk passed the check.
            self._offsets, self._lengths = offsets, lengths
            self._heads = np.empty((n, layout.num_var), np.int64)
            self._checked = bytearray(-(-n // _HEAD_CHUNK))
            if n:
                self._check_heads(0)  # a small shard is checked whole, here
        return n, offsets

    def _check_heads(self, chunk: int) -> None:
        """Read the heads of records ``chunk * _HEAD_CHUNK ...`` and check them against the offsets."""
        assert self._heads is not None
        layout = self.layout
        lo = chunk * _HEAD_CHUNK
        hi = min(self._heads.shape[0], lo + _HEAD_CHUNK)
        columns = np.arange(layout.num_var) * 4
        heads = _read_u32(self._u8, self._offsets[lo:hi, None] + columns)
        want = 4 * layout.num_var + layout.fixed_size + heads.sum(axis=1)
        bad = np.flatnonzero(want != self._lengths[lo:hi])
        if bad.size:
            k = int(bad[0])
            raise self._fail(f"the record has {self._lengths[lo + k]} bytes but its head describes {want[k]}", lo + k)
        self._heads[lo:hi] = heads
        self._checked[chunk] = 1

    def _checked_heads(self, idx: npt.NDArray[np.int64]) -> npt.NDArray[np.int64]:
        """The heads of records ``idx`` (valid indexes), checking their chunks first if needed."""
        assert self._heads is not None
        checked = self._checked
        for chunk in set((idx // _HEAD_CHUNK).tolist()):
            if not checked[chunk]:
                self._check_heads(chunk)
        return self._heads[idx]

    def __len__(self) -> int:
        return self.num_samples

    @property
    def nbytes(self) -> int:
        """Size of the uncompressed shard in bytes."""
        return len(self._u8)

    @property
    def buffer(self) -> bytes | bytearray | mmap.mmap:
        """The buffer the shard is read from (for hashing it in place)."""
        return self._buf

    def _check(self, index: int) -> int:
        if not -self.num_samples <= index < self.num_samples:
            raise out_of_range(f"{self.name} (shard {self.shard})", index, self.num_samples)
        return index % self.num_samples if index < 0 else index

    def record(self, index: int) -> bytes:
        """The raw bytes of sample ``index`` (between two offsets)."""
        i = self._check(index)
        return bytes(self._view[self._offsets[i] : self._offsets[i + 1]])

    def get(self, index: int) -> dict[str, Any]:
        """Decode sample ``index`` (negative counts from the end).

        Raises:
            SampleIndexError: the index is out of range.
            EncodingError: a column's bytes do not decode (names the sample and column).
        """
        i = index if 0 <= index < self.num_samples else self._check(index)
        if self._heads is not None and not self._checked[i // _HEAD_CHUNK]:
            self._check_heads(i // _HEAD_CHUNK)
        (begin,) = _OFFSET.unpack_from(self._view, 4 + 4 * i)
        try:
            return self.layout.decode(self._view, begin)
        except AstreamError:
            raise
        except Exception as exc:
            raise self._decode_error(i, begin, exc) from exc

    def _decode_error(self, i: int, begin: int, exc: BaseException) -> EncodingError:
        found = self.layout.failing_column(self._view, begin)
        column, cause = found if found is not None else ("?", exc)
        spec = self.layout.specs[self.layout.names.index(column)] if column in self.layout.names else "?"
        return EncodingError(
            f"{self.name} (shard {self.shard}), sample {i}, column {column!r}: cannot decode as {spec!r} "
            f"({type(cause).__name__}: {cause}); the shard is corrupt: delete it so it is fetched again"
        )

    def get_batch(self, ids: Sequence[int] | npt.NDArray[np.integer[Any]]) -> dict[str, Any]:
        """Decode many samples at once, column by column.

        Fixed-size numeric columns come back as one array of shape ``(len(ids), *shape)``;
        other columns as a list. Order follows ``ids`` (repeats allowed).

        Raises:
            SampleIndexError: an index is out of range.
            EncodingError: a value does not decode.
        """
        idx = np.asarray(ids, dtype=np.int64).reshape(-1)
        n = self.num_samples
        if idx.size and (idx.min() < -n or idx.max() >= n):
            bad = int(idx[(idx < -n) | (idx >= n)][0])
            raise out_of_range(f"{self.name} (shard {self.shard})", bad, n)
        idx = np.where(idx < 0, idx + n, idx)
        layout = self.layout
        if self._region is not None or (n == 0 and layout.num_var == 0):
            return self._batch_fixed(idx)
        begins = self._offsets[idx] + 4 * layout.num_var
        heads = self._checked_heads(idx) if self._heads is not None else np.zeros((len(idx), 0), np.int64)
        out: dict[str, Any] = {}
        pos = begins
        for name, enc, size, var in zip(layout.names, layout.encodings, layout.sizes, _var_slots(layout), strict=True):
            length = np.full(len(idx), size, np.int64) if size is not None else heads[:, var]
            if enc.batchable and size is not None:
                out[name] = enc.decode_block(self._gather(pos, size))
            else:
                out[name] = self._decode_each(name, enc, idx, pos, length)
            pos = pos + length
        return out

    def _batch_fixed(self, idx: npt.NDArray[np.int64]) -> dict[str, Any]:
        rows = np.empty((len(idx), self.layout.fixed_size), np.uint8)
        self.copy_rows(idx, rows)
        return decode_rows(self.layout, rows, f"{self.name} (shard {self.shard})", idx)

    def copy_rows(
        self, idx: npt.NDArray[np.int64], out: npt.NDArray[np.uint8], where: npt.NDArray[np.int64] | None = None
    ) -> None:
        """Copy the records ``idx`` of an all-fixed-size shard into rows ``where`` of ``out``.

        ``idx`` must be valid (non-negative, in range); ``out`` is ``(m, record_size)`` uint8.
        """
        if self._region is None:
            if len(idx):
                raise UsageError(f"{self.name} (shard {self.shard}) has variable-size columns: no fixed rows")
            return
        if self.layout.fixed_size >= _ROW_LOOP_BYTES:
            # Big records: one memcpy per row straight into place beats a gather into a
            # temporary followed by a scatter.
            targets = range(len(idx)) if where is None else where.tolist()
            region = self._region
            for target, source in zip(targets, idx.tolist(), strict=True):
                out[target] = region[source]
        elif where is None:
            self._region.take(idx, axis=0, out=out)  # the method: no wrapper per shard and batch
        else:
            out[where] = self._region[idx]

    def _gather(self, starts: npt.NDArray[np.int64], size: int) -> npt.NDArray[np.uint8]:
        if len(starts) * size <= _GATHER_LIMIT:
            gathered: npt.NDArray[np.uint8] = self._u8[starts[:, None] + np.arange(size)]
            return gathered
        out = np.empty((len(starts), size), np.uint8)
        for k, start in enumerate(starts.tolist()):
            out[k] = self._u8[start : start + size]
        return out

    def _decode_each(
        self, name: str, enc: Encoding, idx: npt.NDArray[np.int64],
        starts: npt.NDArray[np.int64], lengths: npt.NDArray[np.int64],
    ) -> list[Any]:
        begin = starts.tolist()
        end = (starts + lengths).tolist()
        try:
            return enc.decode_spans(self._view, begin, end)
        except AstreamError:
            raise
        except Exception:
            pass  # find the sample that fails, for the message
        for k, (a, b) in enumerate(zip(begin, end, strict=True)):
            try:
                enc.decode_unchecked(self._view[a:b])
            except AstreamError:
                raise
            except Exception as exc:
                raise EncodingError(
                    f"{self.name} (shard {self.shard}), sample {int(idx[k])}, column {name!r}: cannot decode "
                    f"as {enc.name!r} ({type(exc).__name__}: {exc}); the shard is corrupt: delete it so it is "
                    "fetched again"
                ) from exc
        raise AssertionError("decode_spans failed but every value decodes alone")  # pragma: no cover

    def close(self) -> None:
        """Release the buffer (unmaps an mmap). Idempotent."""
        self._region = None
        self._u8 = np.zeros(0, np.uint8)
        view, self._view = self._view, memoryview(b"")
        try:
            view.release()
            if isinstance(self._buf, mmap.mmap):
                self._buf.close()
        except BufferError:
            pass  # a caller still holds a view; the mapping goes when it does

    def __enter__(self) -> ShardReader:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def decode_rows(
    layout: RecordLayout, rows: npt.NDArray[np.uint8], where: str, ids: npt.NDArray[np.int64]
) -> dict[str, Any]:
    """Decode the columns of all-fixed-size records stacked as ``(m, record_size)`` rows.

    ``where`` and ``ids`` (the samples' indices) only go into error messages.
    """
    out: dict[str, Any] = {}
    start = 0
    record = layout.fixed_size
    for name, enc, size in zip(layout.names, layout.encodings, layout.sizes, strict=True):
        assert size is not None
        if enc.batchable:
            out[name] = enc.decode_block(rows[:, start : start + size])
        else:  # an encoding without a vectorised decoder: one value at a time
            flat = memoryview(rows.tobytes())
            begins = [k * record + start for k in range(len(rows))]
            try:
                out[name] = enc.decode_spans(flat, begins, [b + size for b in begins])
            except AstreamError:
                raise
            except Exception as exc:
                raise EncodingError(
                    f"{where}, one of samples {ids.tolist()[:8]}..., column {name!r}: cannot decode as "
                    f"{enc.name!r} ({type(exc).__name__}: {exc}); the shard is corrupt"
                ) from exc
        start += size
    return out


def _var_slots(layout: RecordLayout) -> list[int]:
    slots, var = [], 0
    for size in layout.sizes:
        slots.append(var if size is None else -1)
        var += size is None
    return slots
