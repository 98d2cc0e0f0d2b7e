"""Arrow record batches straight to MDS records, column by column: the converters' fast path.

When every column of a batch is of a plain kind (numbers stored as their own or a wider
dtype, text, binary, numeric arrays of a fixed shape), the records are built from the
Arrow buffers: one NumPy conversion per column, then one join per row. The bytes are those
:meth:`RecordLayout.encode` makes of the same row's sample (a test compares both); any
other column (json, dates, variable-shape arrays, a value that needs a check, an image to
decode) sends the whole batch down the per-sample path, which also names a bad value.
"""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np

from astream._format.encodings.scalars import NUMERIC_DTYPES
from astream._format.record import RecordLayout

__all__ = ["batch_records"]

_UINT32_MAX = (1 << 32) - 1


def _fixed_rows(data: bytes, size: int, n: int) -> list[bytes]:
    return [data[i * size : (i + 1) * size] for i in range(n)]


def _numbers(pa: Any, array: Any, spec: str) -> np.ndarray[Any, Any] | None:
    target = np.dtype(NUMERIC_DTYPES["int64" if spec == "int" else spec])
    kind = array.type
    if pa.types.is_boolean(kind):
        source: np.dtype[Any] = np.dtype(np.bool_)
    elif pa.types.is_integer(kind) or pa.types.is_floating(kind):
        source = np.dtype(kind.to_pandas_dtype())
    else:
        return None
    # Only casts that keep every value exactly (what the per-sample encoder would store).
    if not np.can_cast(source, target, "safe"):
        return None
    values = np.ascontiguousarray(array.to_numpy(zero_copy_only=False), dtype=target)
    return values.view(np.uint8).reshape(len(array), target.itemsize)


def _variable(pa: Any, array: Any, spec: str) -> tuple[list[bytes], np.ndarray[Any, Any]] | None:
    kind = array.type
    text = pa.types.is_string(kind) or pa.types.is_large_string(kind)
    binary = pa.types.is_binary(kind) or pa.types.is_large_binary(kind)
    if not ((spec == "str" and text) or (spec == "bytes" and binary)):
        return None
    _, offsets_buf, data_buf = array.buffers()
    width = np.int64 if pa.types.is_large_string(kind) or pa.types.is_large_binary(kind) else np.int32
    offsets = np.frombuffer(offsets_buf, width)[array.offset : array.offset + len(array) + 1].astype(np.int64)
    lengths = np.diff(offsets)
    if lengths.size and int(lengths.max()) > _UINT32_MAX:
        return None
    # Only this batch's bytes: a slice of a larger array shares its whole data buffer.
    lo, hi = (int(offsets[0]), int(offsets[-1])) if len(offsets) else (0, 0)
    data = bytes(memoryview(data_buf)[lo:hi]) if data_buf is not None else b""
    bounds = (offsets - lo).tolist()
    return [data[a:b] for a, b in itertools.pairwise(bounds)], lengths


def _fixed_array(pa: Any, array: Any, encoding: Any) -> np.ndarray[Any, Any] | None:
    size = encoding.size
    dtype = getattr(encoding, "dtype", None)
    if size is None or dtype is None:
        return None
    values = array
    while pa.types.is_fixed_size_list(values.type):
        values = values.flatten()  # honours the slice's offset
    if pa.types.is_nested(values.type) or values.null_count or len(values) * dtype.itemsize != size * len(array):
        return None
    leaf = values.to_numpy(zero_copy_only=False)
    if leaf.dtype != dtype.newbyteorder("="):
        return None
    return np.ascontiguousarray(leaf).view(np.uint8).reshape(len(array), size)


def batch_records(pa: Any, batch: Any, layout: RecordLayout) -> list[bytes] | None:
    """The records of ``batch`` for ``layout``, or None where a column needs the per-sample path.

    ``batch`` must hold every column of the layout (the caller checks); a null sends the
    batch to the per-sample path, which names it.
    """
    n = batch.num_rows
    # Per column in storage order: an (n, size) uint8 block, or the rows' bytes and lengths.
    parts: list[np.ndarray[Any, Any] | list[bytes]] = []
    lengths: list[np.ndarray[Any, Any]] = []
    for name, spec, encoding in zip(layout.names, layout.specs, layout.encodings, strict=True):
        array = batch.column(name)
        if array.null_count:
            return None
        base = spec.partition(":")[0]
        part: np.ndarray[Any, Any] | list[bytes] | None
        if spec == "int" or spec in NUMERIC_DTYPES:
            part = _numbers(pa, array, spec)
        elif spec in ("str", "bytes"):
            found = _variable(pa, array, spec)
            if found is None:
                return None
            part, length = found
            lengths.append(length)
        elif base == "ndarray" and pa.types.is_fixed_size_list(array.type):
            part = _fixed_array(pa, array, encoding)
        else:
            return None
        if part is None:
            return None
        parts.append(part)
    if lengths:
        # The head: one uint32 length per variable-size column, in column order.
        parts.insert(0, np.stack(lengths, axis=1).astype("<u4").view(np.uint8).reshape(n, 4 * len(lengths)))
    # Neighbouring fixed-size columns (and the head) become one piece per row, so a row of
    # ints around one text is two pieces to join, not one per column.
    pieces: list[list[bytes]] = []
    run: list[np.ndarray[Any, Any]] = []
    for part in [*parts, None]:
        if isinstance(part, np.ndarray):
            run.append(part)
            continue
        if run:
            block = np.concatenate(run, axis=1) if len(run) > 1 else run[0]
            pieces.append(_fixed_rows(np.ascontiguousarray(block).tobytes(), block.shape[1], n))
            run = []
        if part is not None:
            pieces.append(part)
    if len(pieces) == 1:
        return pieces[0]
    return list(map(b"".join, zip(*pieces, strict=True)))
