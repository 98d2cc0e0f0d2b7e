"""Arrow types -> MDS column encodings, and Arrow record batches -> MDS samples.

:func:`arrow_columns` decides every column's encoding from the Arrow schema alone, on the
driver, before any task runs (so a type MDS cannot store fails at once, naming the column):

===============================================  ==========================================
Arrow type                                       encoding (and the value written)
===============================================  ==========================================
bool                                             ``uint8`` (0 or 1)
int8 ... uint64, float16/32/64                   the same-named numeric (int64 -> ``int``)
string, large_string                             ``str``
binary, large_binary, fixed_size_binary          ``bytes`` (images stay their file bytes)
decimal                                          ``str_decimal``
date32, date64                                   ``int64``: days since 1970-01-01
timestamp (any unit, any zone)                   ``int64``: nanoseconds since 1970-01-01 UTC
fixed_size_list of fixed_size_list ... numbers   ``ndarray:DTYPE:D0,D1,...`` (the fixed shape)
list / large_list (nested too) of numbers        ``ndarray:DTYPE`` (each row keeps its shape)
struct, map, list of text or structs             ``json`` (of JSON values only: no binary, decimal, date, time)
===============================================  ==========================================

MDS has no nulls: a null raises :class:`SampleError` naming the column and row, except in a
``json`` column (stored as JSON ``null``). An explicit ``columns=`` entry wins over the
inferred one; a binary column given an image encoding (``jpeg``, ``png``, ``pil``,
``jpeg_array``...) is decoded with Pillow first ("decoded on request").
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from typing import Any

import numpy as np

from astream._format.encodings import get_encoding
from astream._format.encodings.ndarray import DTYPE_CODES
from astream.errors import ConfigError, EncodingError, MissingExtraError, SampleError

__all__ = ["TYPE_TABLE", "arrow_columns", "batch_samples", "json_compatible", "pyarrow"]

TYPE_TABLE = (
    "bool, int8..uint64, float16/32/64, string, binary, decimal, date32/64, timestamp, "
    "(fixed_size_)list of numbers nested to any depth, struct, map, list of strings"
)
_JSON_HINT = ", and JSON has no binary, decimal, date or time values"
_IMAGE_ENCODINGS = ("pil", "jpeg", "png", "jpeg_array", "jpegarray")
_NS_PER_UNIT = {"s": 1_000_000_000, "ms": 1_000_000, "us": 1_000, "ns": 1}


def pyarrow() -> Any:
    """The ``pyarrow`` module, or MissingExtraError naming the extra."""
    try:
        import pyarrow as pa
    except ImportError as exc:
        raise MissingExtraError("distributed conversion", "convert", "pyarrow") from exc
    return pa


def _list_leaf(pa: Any, kind: Any) -> tuple[Any, list[int | None]]:
    """The innermost value type of nested lists and the dims (None where a list is variable)."""
    dims: list[int | None] = []
    while _is_list(pa, kind):
        dims.append(kind.list_size if pa.types.is_fixed_size_list(kind) else None)
        kind = kind.value_type
    return kind, dims


def _numeric_name(pa: Any, kind: Any) -> str | None:
    if pa.types.is_integer(kind) or pa.types.is_floating(kind):
        return str(np.dtype(kind.to_pandas_dtype()).name)
    return None


def infer_encoding(pa: Any, kind: Any) -> str | None:
    """The MDS encoding of one Arrow type, or None if MDS cannot store it."""
    types = pa.types
    if types.is_dictionary(kind):
        return infer_encoding(pa, kind.value_type)
    if types.is_boolean(kind):
        return "uint8"
    numeric = _numeric_name(pa, kind)
    if numeric is not None:
        return "int" if numeric == "int64" else numeric
    if types.is_string(kind) or types.is_large_string(kind):
        return "str"
    if types.is_binary(kind) or types.is_large_binary(kind) or types.is_fixed_size_binary(kind):
        return "bytes"
    if types.is_decimal(kind):
        return "str_decimal"
    if types.is_date(kind) or types.is_timestamp(kind):
        return "int64"
    if _is_list(pa, kind):
        leaf, dims = _list_leaf(pa, kind)
        name = "uint8" if types.is_boolean(leaf) else _numeric_name(pa, leaf)
        if name in DTYPE_CODES:
            if all(d is not None and d > 0 for d in dims):
                return f"ndarray:{name}:{','.join(str(d) for d in dims)}"
            return f"ndarray:{name}"
        if name is None and (types.is_string(leaf) or types.is_large_string(leaf) or types.is_struct(leaf)):
            return "json" if json_compatible(pa, kind) else None
        return None
    if types.is_struct(kind) or types.is_map(kind):
        return "json" if json_compatible(pa, kind) else None
    return None


def json_compatible(pa: Any, kind: Any) -> bool:
    """Whether every value of an Arrow type is JSON-serialisable as ``to_pylist`` gives it
    (binary, decimals, dates and times come out as bytes, Decimal and datetime objects)."""
    types = pa.types
    if types.is_dictionary(kind):
        return json_compatible(pa, kind.value_type)
    if (types.is_null(kind) or types.is_boolean(kind) or types.is_integer(kind) or types.is_floating(kind)
            or types.is_string(kind) or types.is_large_string(kind)):
        return True
    if _is_list(pa, kind):
        return json_compatible(pa, kind.value_type)
    if types.is_map(kind):
        return json_compatible(pa, kind.key_type) and json_compatible(pa, kind.item_type)
    if types.is_struct(kind):
        return all(json_compatible(pa, kind.field(i).type) for i in range(kind.num_fields))
    return False


def arrow_columns(schema: Any, columns: Mapping[str, str] | None = None) -> dict[str, str]:
    """The MDS encodings of the fields of an Arrow schema, ``columns`` overriding.

    Args:
        schema: a ``pyarrow.Schema`` (a Spark, Ray or Dask frame's schema converts to one).
        columns: encodings given by the user; every name must be a field of ``schema``.

    Returns:
        Column name -> encoding, in schema order.

    Raises:
        ConfigError: an override names no field or is not an encoding, or a field has a
            type MDS cannot store (the message names the column and the types it can take).
    """
    pa = pyarrow()
    columns = dict(columns or {})
    names = list(schema.names)
    unknown = sorted(set(columns) - set(names))
    if unknown:
        raise ConfigError(f"columns= names {', '.join(unknown)}, but the data's columns are {', '.join(names)}")
    out: dict[str, str] = {}
    for field in schema:
        given = columns.get(field.name)
        if given is not None:
            try:
                get_encoding(given)
            except EncodingError as exc:
                raise ConfigError(f"column {field.name!r}: {exc}") from exc
            if given == "json" and not json_compatible(pa, field.type):
                raise ConfigError(f"column {field.name!r} has Arrow type {field.type}, whose values are not all "
                                  f"JSON-serialisable{_JSON_HINT}; cast it, or give it another encoding (pkl)")
            out[field.name] = given
            continue
        encoding = infer_encoding(pa, field.type)
        if encoding is None:
            nested = _is_list(pa, field.type) or pa.types.is_struct(field.type) or pa.types.is_map(field.type)
            raise ConfigError(
                f"column {field.name!r} has Arrow type {field.type}, which MDS cannot store"
                f"{' (a struct, map or list of text is stored as json' + _JSON_HINT + ')' if nested else ''}; "
                f"the types it can take are {TYPE_TABLE}. Cast it, drop it, or give its encoding in columns="
            )
        out[field.name] = encoding
    return out


# -- values --------------------------------------------------------------------------------------

def _is_list(pa: Any, kind: Any) -> bool:
    return bool(pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind))


def _rows_of_lists(pa: Any, array: Any, dtype: np.dtype[Any], shape: tuple[int, ...] | None) -> list[Any]:
    """One NumPy array per row of a (nested) list array, read column-wise from its buffers.

    Each level's offsets index the next level's logical positions; a row's shape is the
    common length of its lists at each depth (a ragged row raises ValueError).
    """
    levels: list[np.ndarray] = []
    fixed: list[int] = []
    current = array
    while _is_list(pa, current.type):
        if pa.types.is_fixed_size_list(current.type):
            size = current.type.list_size
            fixed.append(size)
            levels.append((np.arange(len(current) + 1, dtype=np.int64) + current.offset) * size)
        else:
            levels.append(current.offsets.to_numpy().astype(np.int64))
        current = current.values
    if current.null_count:
        raise ValueError("a value inside the lists is null")
    leaf = current.to_numpy(zero_copy_only=False)
    if leaf.dtype != dtype:
        leaf = _checked_cast(leaf, dtype, levels)
    n = len(array)
    if len(fixed) == len(levels) and n:
        # Every level fixed: the rows are one block, each a view of it.
        lo = int(levels[0][0])
        for offsets in levels[1:]:
            lo = int(offsets[lo])
        block = leaf[lo : lo + n * int(np.prod(fixed))].reshape(n, *fixed)
        return list(block if shape is None or block.shape[1:] == shape else block.reshape(n, *shape))
    rows: list[Any] = []
    for i in range(n):
        lo, hi = i, i + 1
        dims: list[int] = []
        for depth, offsets in enumerate(levels):
            lengths = offsets[lo + 1 : hi + 1] - offsets[lo:hi]
            if lengths.size and (lengths != lengths[0]).any():
                raise ValueError(f"row {i} is ragged: its lists at depth {depth} have lengths "
                                 f"{sorted(set(lengths.tolist()))}, an ndarray needs one shape")
            dims.append(int(lengths[0]) if lengths.size else 0)
            lo, hi = int(offsets[lo]), int(offsets[hi])
        value = leaf[lo:hi].reshape(dims)
        if shape is not None and value.shape != shape and value.size == int(np.prod(shape)):
            value = value.reshape(shape)
        rows.append(value)
    return rows


def _checked_cast(leaf: np.ndarray, dtype: np.dtype[Any], levels: list[np.ndarray]) -> np.ndarray:
    """``leaf`` as ``dtype``, refusing what the scalar encoders refuse: a non-integer into an
    integer dtype, an integer out of its range, a finite number that overflows to inf.

    Only the values the rows hold are checked (a sliced batch shares its child's buffer).
    """
    lo, hi = int(levels[0][0]), int(levels[0][-1])
    for offsets in levels[1:]:
        lo, hi = int(offsets[lo]), int(offsets[hi])
    held = leaf[lo:hi]
    bad: np.ndarray | None = None
    why = ""
    if dtype.kind in "iu":
        if leaf.dtype.kind not in "biu":
            raise ValueError(f"{dtype} holds integers, and the lists hold {leaf.dtype} values")
        info = np.iinfo(dtype)
        if held.size and leaf.dtype.kind != "b":
            bad = np.flatnonzero((held < info.min) | (held > info.max))
            why = f"{dtype} holds {info.min}..{info.max}"
    with np.errstate(over="ignore", invalid="ignore"):
        out = leaf.astype(dtype)
    if dtype.kind == "f" and held.size:
        bad = np.flatnonzero(np.isinf(out[lo:hi]) & np.isfinite(held.astype(np.float64)))
        why = f"{dtype} cannot hold it (it overflows to inf)"
    if bad is not None and bad.size:
        position = lo + int(bad[0])
        row = position
        for offsets in reversed(levels):
            row = int(np.searchsorted(offsets, row, side="right")) - 1
        raise _RowError(row, f"it holds {leaf[position].item()!r}, and {why}")
    return out


class _RowError(ValueError):
    """A value of row ``row`` that its column's encoding cannot hold."""

    def __init__(self, row: int, message: str) -> None:
        super().__init__(message)
        self.row = row


def _column_values(pa: Any, array: Any, encoding: str) -> list[Any]:
    kind = array.type
    base = encoding.partition(":")[0]
    if pa.types.is_dictionary(kind):
        array = array.dictionary_decode()
        kind = array.type
    if pa.types.is_timestamp(kind):
        factor = _NS_PER_UNIT[kind.unit]
        ints = array.cast(pa.int64()).to_numpy(zero_copy_only=False)
        return [int(v) * factor for v in ints.tolist()]
    if pa.types.is_date64(kind):
        array = array.cast(pa.date32())
        kind = array.type
    if pa.types.is_date32(kind):
        return array.cast(pa.int32()).to_numpy(zero_copy_only=False).astype(np.int64).tolist()  # type: ignore[no-any-return]
    if base == "ndarray" and _is_list(pa, kind):
        parts = encoding.split(":")
        leaf, _ = _list_leaf(pa, kind)
        dtype = np.dtype(parts[1] if len(parts) > 1 else ("uint8" if pa.types.is_boolean(leaf) else leaf.to_pandas_dtype()))
        shape = tuple(int(d) for d in parts[2].split(",")) if len(parts) > 2 else None
        return _rows_of_lists(pa, array, dtype, shape)
    if base in _IMAGE_ENCODINGS and (pa.types.is_binary(kind) or pa.types.is_large_binary(kind)):
        return [_open_image(v) for v in array.to_pylist()]
    if pa.types.is_boolean(kind) or pa.types.is_integer(kind) or pa.types.is_floating(kind):
        return array.to_numpy(zero_copy_only=False).tolist()  # type: ignore[no-any-return]
    return array.to_pylist()  # type: ignore[no-any-return]


def _open_image(data: bytes) -> Any:
    try:
        from PIL import Image
    except ImportError as exc:
        raise MissingExtraError("decoding images", "image", "Pillow") from exc
    import io

    image = Image.open(io.BytesIO(data))
    image.load()
    return image


def _null_check(array: Any, name: str, encoding: str, where: Callable[[int], str]) -> None:
    if array.null_count and encoding != "json":
        row = int(array.is_null().to_numpy(zero_copy_only=False).argmax())
        raise SampleError(f"{where(row)}: column {name!r} ({encoding}) is null; MDS has no nulls: fill or drop "
                          "the nulls, or store the column as json")


def batch_samples(batch: Any, columns: Mapping[str, str], where: Callable[[int], str] | None = None) -> Iterator[dict[str, Any]]:
    """The rows of an Arrow record batch (or table) as samples for ``columns``.

    Args:
        batch: a ``pyarrow.RecordBatch`` or ``pyarrow.Table``.
        columns: the encodings (from :func:`arrow_columns`); other fields are dropped.
        where: names a row (by its number in the batch) in error messages.

    Raises:
        SampleError: a column is missing, a value is null, or a list cannot take its encoding.
    """
    pa = pyarrow()
    where = where or (lambda i: f"row {i}")
    if isinstance(batch, pa.Table):
        batch = batch.combine_chunks().to_batches()[0] if batch.num_rows else pa.RecordBatch.from_pylist([], batch.schema)
    missing = [n for n in columns if n not in batch.schema.names]
    if missing:
        raise SampleError(f"{where(0)}: the data has no column(s) {', '.join(missing)} (it has {', '.join(batch.schema.names)})")
    values: list[list[Any]] = []
    for name, encoding in columns.items():
        array = batch.column(name)
        _null_check(array, name, encoding, where)
        try:
            values.append(_column_values(pa, array, encoding))
        except (ValueError, TypeError) as exc:
            culprit = exc.row if isinstance(exc, _RowError) else 0
            raise SampleError(f"{where(culprit)}: column {name!r} ({array.type}) cannot be written as {encoding}: {exc}") from exc
    names = list(columns)
    for row in zip(*values, strict=True):
        yield dict(zip(names, row, strict=True))
