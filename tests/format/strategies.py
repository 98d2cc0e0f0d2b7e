"""Hypothesis strategies for MDS column values, one per encoding, and value equality."""

from __future__ import annotations

import io
import math
from decimal import Decimal
from typing import Any

import numpy as np
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

INT_RANGES = {
    "uint8": (0, 2**8 - 1), "uint16": (0, 2**16 - 1), "uint32": (0, 2**32 - 1), "uint64": (0, 2**64 - 1),
    "int8": (-(2**7), 2**7 - 1), "int16": (-(2**15), 2**15 - 1), "int32": (-(2**31), 2**31 - 1),
    "int64": (-(2**63), 2**63 - 1), "int": (-(2**63), 2**63 - 1),
}
FLOAT_WIDTHS = {"float16": 16, "float32": 32, "float64": 64}
ARRAY_DTYPES = ["uint8", "int8", "uint16", "int16", "float16", "uint32", "int32", "float32", "uint64", "int64", "float64"]
# Pillow modes with a raw layout `pil` stores, and the subsets PNG and JPEG can save.
PIL_MODES = ["1", "L", "P", "RGB", "RGBA", "CMYK", "LA", "I", "F", "I;16"]
PNG_MODES = ["1", "L", "RGB", "RGBA", "LA", "I;16"]  # P: Pillow renumbers palettes on save
JPEG_MODES = ["L", "RGB", "CMYK"]

json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8),
    lambda children: st.lists(children, max_size=4) | st.dictionaries(st.text(max_size=6), children, max_size=4),
    max_leaves=12,
)
pickle_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=8)
    | st.binary(max_size=8) | st.complex_numbers(allow_nan=False) | st.decimals(allow_nan=False),
    lambda children: st.lists(children, max_size=4) | st.tuples(children, children)
    | st.dictionaries(st.text(max_size=6), children, max_size=4) | st.frozensets(st.integers(), max_size=4),
    max_leaves=12,
)


def shapes(max_dims: int = 4) -> st.SearchStrategy[tuple[int, ...]]:
    return hnp.array_shapes(min_dims=1, max_dims=max_dims, min_side=1, max_side=5)


def arrays(dtype: str, shape: tuple[int, ...] | st.SearchStrategy[tuple[int, ...]] | None = None) -> st.SearchStrategy[Any]:
    return hnp.arrays(np.dtype(dtype), shapes() if shape is None else shape)


@st.composite
def images(draw: st.DrawFn, modes: list[str]) -> Any:
    from PIL import Image

    mode = draw(st.sampled_from(modes))
    size = (draw(st.integers(1, 9)), draw(st.integers(1, 9)))
    nbytes = len(Image.new(mode, size).tobytes())
    return Image.frombytes(mode, size, draw(st.binary(min_size=nbytes, max_size=nbytes)))


@st.composite
def jpeg_files(draw: st.DrawFn) -> bytes:
    out = io.BytesIO()
    draw(images(JPEG_MODES)).save(out, format="JPEG")
    return out.getvalue()


def values_for(encoding: str) -> st.SearchStrategy[Any]:
    """Values a user may write into a column of ``encoding``."""
    if encoding in INT_RANGES:
        low, high = INT_RANGES[encoding]
        return st.integers(low, high)
    if encoding in FLOAT_WIDTHS:
        return st.floats(width=FLOAT_WIDTHS[encoding])  # type: ignore[arg-type]
    if encoding.startswith("ndarray"):
        parts = encoding.split(":")
        if len(parts) == 1:
            return st.sampled_from(ARRAY_DTYPES).flatmap(arrays)
        if len(parts) == 2:
            return arrays(parts[1])
        return arrays(parts[1], tuple(int(d) for d in parts[2].split(",")))
    simple: dict[str, st.SearchStrategy[Any]] = {
        "bytes": st.binary(max_size=64),
        "str": st.text(max_size=32),
        "str_int": st.integers(-(10**40), 10**40),
        "str_float": st.floats(),
        "str_decimal": st.decimals(places=None),
        "json": json_values,
        "pkl": pickle_values,
        "pil": images(PIL_MODES),
        "png": images(PNG_MODES),
        "jpeg": images(JPEG_MODES),
        "list[pil]": st.lists(images(PIL_MODES), max_size=3),
        "list[png]": st.lists(images(PNG_MODES), max_size=3),
        "list[jpeg]": st.lists(images(JPEG_MODES), max_size=3),
        "jpeg_array": st.lists(jpeg_files(), min_size=1, max_size=3),
        "jpegarray": st.lists(jpeg_files(), min_size=1, max_size=3),
    }
    return simple[encoding]


def same(encoding: str, written: Any, read: Any) -> bool:
    """True if ``read`` is what decoding must give for ``written`` in ``encoding``."""
    if encoding in ("int", "str_int"):
        return type(read) is int and read == written
    if encoding in INT_RANGES:
        return type(read) is np.dtype(encoding).type and int(read) == written
    if encoding in FLOAT_WIDTHS:
        wanted = np.array(written, np.dtype(encoding))
        return type(read) is np.dtype(encoding).type and read.tobytes() == wanted.tobytes()
    if encoding == "str_float":
        return type(read) is float and (read == written or (math.isnan(read) and math.isnan(written)))
    if encoding == "str_decimal":
        return isinstance(read, Decimal) and str(read) == str(written)
    if encoding.startswith("ndarray"):
        return isinstance(read, np.ndarray) and read.dtype == written.dtype and read.shape == written.shape and (
            read.tobytes() == np.ascontiguousarray(written).tobytes()
        )
    if encoding == "pkl":  # the strategy has no nan, so == is exact (sets may re-pickle in another order)
        return type(read) is type(written) and read == written
    if encoding in ("pil", "png"):
        return _same_image(written, read, exact=True)
    if encoding == "jpeg":
        return _same_image(written, read, exact=False)
    if encoding.startswith("list["):
        element = encoding[5:-1]
        return type(read) is list and len(read) == len(written) and all(
            same(element, w, r) for w, r in zip(written, read, strict=True)
        )
    if encoding in ("jpeg_array", "jpegarray"):
        from PIL import Image

        return type(read) is list and len(read) == len(written) and all(
            _same_image(Image.open(io.BytesIO(w)), r, exact=True) for w, r in zip(written, read, strict=True)
        )
    return type(read) is type(written) and read == written


def _same_image(written: Any, read: Any, exact: bool) -> bool:
    if (read.mode, read.size) != (written.mode, written.size):
        return False
    return not exact or read.tobytes() == written.tobytes()
