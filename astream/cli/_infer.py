"""Column encodings for ``astream convert``: inferred from sample rows, overridable, and applied.

Inference looks at the first rows of the input and picks the MDS encoding a reader
would expect: Python ints -> ``int``, floats -> ``float64``, text -> ``str``, bytes ->
``bytes``, lists and dicts -> ``json``, NumPy arrays -> ``ndarray:DTYPE[:SHAPE]`` (the
shape only when every row has the same one). CSV cells are text: a column whose
cells all parse as integers becomes ``int``, as numbers ``float64``. ``--columns``
overrides any of it, and :func:`coerce` converts each value to what its encoding takes
(the text ``"3"`` into ``3`` for an ``int`` column, a list into an array for ``ndarray``).
"""

from __future__ import annotations

import json
from collections.abc import Iterable, Mapping, Sequence
from decimal import Decimal
from typing import Any

import numpy as np

from astream._format.encodings import get_encoding
from astream._format.encodings.ndarray import DTYPE_CODES
from astream._format.encodings.scalars import NUMERIC_DTYPES
from astream.cli._output import CommandError
from astream.errors import EncodingError

__all__ = ["coerce", "infer_columns", "parse_column_overrides"]

_INT_NAMES = {"int", "str_int", *(n for n in NUMERIC_DTYPES if n[0] in "ui")}
_FLOAT_NAMES = {"str_float", *(n for n in NUMERIC_DTYPES if n.startswith("float"))}


def parse_column_overrides(texts: Iterable[str]) -> dict[str, str]:
    """``["x:ndarray:float32:3,4,y:int"]`` -> ``{"x": "ndarray:float32:3,4", "y": "int"}``.

    Commas separate columns, but an ndarray shape has commas too: a piece without a
    ``:`` continues the previous one.

    Raises:
        CommandError: (code 2) a piece is not ``NAME:ENCODING`` or the encoding is unknown.
    """
    pieces: list[str] = []
    for text in texts:
        for piece in text.split(","):
            if ":" not in piece and pieces:
                pieces[-1] += "," + piece
            else:
                pieces.append(piece)
    out: dict[str, str] = {}
    for piece in pieces:
        name, sep, encoding = piece.strip().partition(":")
        if not sep or not name or not encoding:
            raise CommandError(f"--columns: {piece!r} is not NAME:ENCODING (e.g. 'label:int,image:jpeg')", 2)
        try:
            get_encoding(encoding)
        except EncodingError as exc:  # its message lists the valid encodings
            raise CommandError(f"--columns {name}: {exc}", 2) from exc
        out[name] = encoding
    return out


def _numeric_text(values: list[str]) -> str | None:
    """``int`` or ``float64`` if every text value parses as one, else None."""
    if not values or any(v.strip() == "" for v in values):
        return None
    try:
        for v in values:
            int(v)
        return "int"
    except ValueError:
        pass
    try:
        for v in values:
            float(v)
        return "float64"
    except ValueError:
        return None


def _array_encoding(values: list[np.ndarray]) -> str:
    dtype = np.result_type(*values)
    name = "uint8" if dtype == np.bool_ else dtype.name
    if name not in DTYPE_CODES:
        raise CommandError(f"NumPy dtype {dtype} has no MDS ndarray encoding (use --columns to pick one)")
    if values[0].ndim == 0:
        return name  # a scalar per row: the numeric encoding of that dtype
    shapes = {v.shape for v in values}
    if len(shapes) == 1 and min(values[0].shape) > 0:
        return f"ndarray:{name}:{','.join(map(str, values[0].shape))}"
    return f"ndarray:{name}"


def _infer_one(name: str, values: list[Any], text: bool) -> str:
    present = [v for v in values if v is not None]
    if not present:
        raise CommandError(f"column {name!r} is empty (null) in every row looked at; give its encoding with "
                           f"--columns {name}:ENCODING")
    if text:
        return _numeric_text(present) or "str"
    if all(isinstance(v, np.ndarray | np.generic) for v in present):
        return _array_encoding([np.asarray(v) for v in present])
    kinds = {type(v) for v in present}
    if kinds <= {bool}:
        return "uint8"
    if kinds <= {int, bool}:
        return "int" if all(-(1 << 63) <= v < (1 << 63) for v in present) else "str_int"
    if kinds <= {int, float, bool}:
        return "float64"
    if kinds <= {str}:
        return "str"
    if kinds <= {bytes, bytearray}:
        return "bytes"
    return "json"


def infer_columns(
    rows: Sequence[Mapping[str, Any]], text: bool, overrides: Mapping[str, str], typed: Mapping[str, str] | None = None,
) -> dict[str, str]:
    """The encodings of the columns of ``rows`` (in first-row order), with ``overrides`` applied.

    Args:
        rows: the first rows of the input.
        text: the values are text cells (CSV): infer numbers from how they parse.
        overrides: encodings given with ``--columns``.
        typed: encodings the input's schema fixes (Parquet); overrides still win.

    Raises:
        CommandError: no rows, an override names no column, or a column cannot be inferred.
    """
    if not rows:
        raise CommandError("the input has no rows to convert")
    names: dict[str, None] = {}
    for row in rows:
        names.update(dict.fromkeys(row))
    unknown = sorted(set(overrides) - set(names))
    if unknown:
        raise CommandError(f"--columns names {', '.join(unknown)}, but the input's columns are "
                           f"{', '.join(names)}", 2)
    typed = typed or {}
    return {n: overrides.get(n) or typed.get(n) or _infer_one(n, [r.get(n) for r in rows], text) for n in names}


def coerce(encoding: str, value: Any, text: bool) -> Any:
    """``value`` converted to what a column of ``encoding`` takes.

    Raises:
        ValueError, TypeError: the value cannot be converted (the caller names the row).
    """
    if value is None:
        raise ValueError("the value is null and MDS has no nulls")
    base = encoding.partition(":")[0]
    if base in _INT_NAMES:
        if isinstance(value, float) and not value.is_integer():
            raise ValueError(f"{value!r} is not an integer")
        return int(value) if not isinstance(value, str) else int(value.strip())
    if base in _FLOAT_NAMES:
        return float(value)
    if base == "str_decimal":
        return Decimal(str(value))
    if base == "str":
        if isinstance(value, str):
            return value
        return json.dumps(value) if isinstance(value, list | dict) else str(value)
    if base == "bytes" and isinstance(value, str):
        return value.encode("utf-8")
    if base == "json" and text and isinstance(value, str):
        return json.loads(value)
    if base == "ndarray":
        if text and isinstance(value, str):
            value = json.loads(value)
        array = np.asarray(value)
        dtype = encoding.split(":")[1] if encoding.count(":") >= 1 else None
        if array.dtype == np.bool_ and dtype is None:
            dtype = "uint8"
        return array.astype(dtype) if dtype is not None and array.dtype != np.dtype(dtype) else array
    return value
