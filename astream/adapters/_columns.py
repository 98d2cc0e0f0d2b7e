"""What a column's values look like in a batch, from its MDS encoding; picking x and y.

A batch from the loader is a dict of NumPy arrays (lists for str/bytes/ragged columns).
Frameworks need to know dtypes and shapes ahead (``tf.data`` element specs), so the
MDS encoding string (``"ndarray:float32:3,32,32"``, ``"int64"``, ``"str"``) is mapped to
a dtype and per-sample shape here, once, without any framework.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from astream.errors import ConfigError

__all__ = ["ColumnKind", "Columns", "column_kind", "select_columns", "to_array"]

_NUMERIC = ("uint8", "uint16", "uint32", "uint64", "int8", "int16", "int32", "int64",
            "float16", "float32", "float64")
# Encodings whose values are text or raw bytes: a string tensor in TensorFlow.
_TEXT = ("str", "bytes", "str_decimal")
# Decoded to Python ints/floats, collated into int64/float64 arrays.
_PY_SCALARS = {"int": "int64", "str_int": "int64", "str_float": "float64"}


@dataclass(frozen=True)
class ColumnKind:
    """How a column's values arrive in a batch.

    Attributes:
        dtype: a NumPy dtype name, ``"string"`` for text/bytes, or None when the
            encoding has no tensor form (json, pickle, images).
        shape: the per-sample shape; None when only known per sample (``ndarray:DTYPE``).
    """

    dtype: str | None
    shape: tuple[int, ...] | None


def column_kind(encoding: str) -> ColumnKind:
    """The dtype and per-sample shape of a column with MDS ``encoding``."""
    if encoding in _NUMERIC:
        return ColumnKind(encoding, ())
    if encoding in _PY_SCALARS:
        return ColumnKind(_PY_SCALARS[encoding], ())
    if encoding in _TEXT:
        return ColumnKind("string", ())
    name, _, args = encoding.partition(":")
    if name == "ndarray" and args:
        dtype, _, shape = args.partition(":")
        if not shape:
            return ColumnKind(dtype, None)
        return ColumnKind(dtype, tuple(int(d) for d in shape.split(",")))
    return ColumnKind(None, None)


Columns = str | Sequence[str] | None


def _check_names(names: Columns, available: Mapping[str, str], role: str) -> None:
    wanted = [names] if isinstance(names, str) else list(names or [])
    missing = [n for n in wanted if n not in available]
    if missing:
        raise ConfigError(
            f"{role} names unknown column(s) {', '.join(map(repr, missing))}; "
            f"the dataset has {', '.join(map(repr, available))}"
        )


def to_array(value: Any) -> Any:
    """A batch column as an array: lists of text stay lists of Python objects."""
    if isinstance(value, np.ndarray):
        return value
    return np.asarray(value)


def select_columns(
    available: Mapping[str, str],
    x: Columns,
    y: Columns,
    sample_weight: Columns,
    map_fn: Callable[[dict[str, Any]], Any] | None,
    leaf: Callable[[Any], Any] = to_array,
) -> Callable[[dict[str, Any]], Any]:
    """A function turning a batch dict into what the framework trains on.

    ``x``/``y``/``sample_weight`` name one column (an array) or several (a dict by
    name, which Keras matches to input names); with none of them the whole batch
    dict is passed on. ``map_fn`` replaces all of that. ``leaf`` converts each picked
    value (the same function builds a ``tf.data`` element spec from a dict of specs).

    Raises:
        ConfigError: both a ``map_fn`` and column names, unknown names, or ``y``
            without ``x``.
    """
    if map_fn is not None:
        if x is not None or y is not None or sample_weight is not None:
            raise ConfigError("give either map_fn or x/y/sample_weight column names, not both")
        if not callable(map_fn):
            raise ConfigError("map_fn must be callable: batch dict -> what model.fit takes")
        return map_fn
    if x is None:
        if y is not None or sample_weight is not None:
            raise ConfigError("y and sample_weight need x: name the input column(s) too")
        return dict
    for names, role in ((x, "x"), (y, "y"), (sample_weight, "sample_weight")):
        _check_names(names, available, role)

    def pick(batch: dict[str, Any], names: Columns) -> Any:
        if isinstance(names, str):
            return leaf(batch[names])
        return {n: leaf(batch[n]) for n in names or ()}

    def select(batch: dict[str, Any]) -> Any:
        if y is None:
            return (pick(batch, x),)
        if sample_weight is None:
            return pick(batch, x), pick(batch, y)
        return pick(batch, x), pick(batch, y), pick(batch, sample_weight)

    return select
