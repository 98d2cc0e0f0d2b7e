"""Scalar and text encodings: ``bytes``, ``str``, ``int``, the numpy scalars, ``str_*``.

Byte layouts follow MosaicML Streaming: ``int`` is a little-endian int64 decoded to a
Python int; ``uint8`` ... ``float64`` are the scalar's little-endian bytes decoded to a
numpy scalar; ``str_int``/``str_float``/``str_decimal`` are ``str(value)`` in UTF-8.
"""

from __future__ import annotations

import numbers
from decimal import Decimal
from typing import Any

import numpy as np
import numpy.typing as npt

from astream._format.encodings.base import Buffer, Encoding

__all__ = [
    "NUMERIC_DTYPES",
    "BytesEncoding",
    "IntEncoding",
    "NumericEncoding",
    "StrDecimalEncoding",
    "StrEncoding",
    "StrFloatEncoding",
    "StrIntEncoding",
]

# encoding name -> little-endian dtype. Pinned to '<' so files are identical on any host.
NUMERIC_DTYPES: dict[str, str] = {
    "uint8": "<u1", "uint16": "<u2", "uint32": "<u4", "uint64": "<u8",
    "int8": "<i1", "int16": "<i2", "int32": "<i4", "int64": "<i8",
    "float16": "<f2", "float32": "<f4", "float64": "<f8",
}
_INT64 = np.dtype("<i8")


def _is_integer(value: object) -> bool:
    # numbers.Integral covers int, bool and numpy integers.
    return isinstance(value, numbers.Integral)


class BytesEncoding(Encoding):
    """``bytes``: the value as is."""

    name = "bytes"

    def encode(self, value: Any) -> bytes:
        if isinstance(value, bytes):
            return value
        if isinstance(value, (bytearray, memoryview)):
            return bytes(value)
        raise self.reject(value, "takes bytes")

    def decode_unchecked(self, data: Buffer) -> bytes:
        return bytes(data)

    def decode_spans(self, view: memoryview, starts: list[int], ends: list[int]) -> list[Any]:
        return [bytes(view[a:b]) for a, b in zip(starts, ends, strict=True)]


class StrEncoding(Encoding):
    """``str``: UTF-8 text."""

    name = "str"

    def encode(self, value: Any) -> bytes:
        if type(value) is not str and not isinstance(value, str):
            raise self.reject(value, "takes a str")
        try:
            return value.encode("utf-8")
        except UnicodeEncodeError as exc:  # lone surrogates cannot be stored
            raise self.reject(value, f"cannot store this string as UTF-8 ({exc.reason})") from exc

    def decode_unchecked(self, data: Buffer) -> str:
        return str(data, "utf-8")

    def decode_spans(self, view: memoryview, starts: list[int], ends: list[int]) -> list[Any]:
        return [str(view[a:b], "utf-8") for a, b in zip(starts, ends, strict=True)]


class IntEncoding(Encoding):
    """``int``: int64, decoded to a Python int (the batch decoder gives an int64 array)."""

    name = "int"
    size = 8
    dtype = _INT64
    shape = ()

    def encode(self, value: Any) -> bytes:
        if type(value) is int and -(1 << 63) <= value < (1 << 63):  # the common case, fast
            return value.to_bytes(8, "little", signed=True)
        if not _is_integer(value):
            raise self.reject(value, "takes an int")
        number = int(value)
        if not -(1 << 63) <= number < (1 << 63):
            raise self.reject(value, f"holds 64-bit ints; {number} does not fit (use 'str_int')")
        return number.to_bytes(8, "little", signed=True)

    def decode_unchecked(self, data: Buffer) -> int:
        if len(data) != 8:
            raise ValueError(f"expected 8 bytes, got {len(data)}")
        return int.from_bytes(data, "little", signed=True)


class NumericEncoding(Encoding):
    """``uint8`` ... ``float64``: one numpy scalar, decoded to a numpy scalar."""

    def __init__(self, name: str) -> None:
        self.name = name
        self._dtype: np.dtype[Any] = np.dtype(NUMERIC_DTYPES[name])
        self.dtype = self._dtype
        self.size = self.dtype.itemsize
        self.shape = ()
        self._kind = self.dtype.kind
        self._info: np.iinfo[Any] | None = np.iinfo(self.dtype) if self._kind in "ui" else None

    def encode(self, value: Any) -> bytes:
        if isinstance(value, np.ndarray) and value.ndim == 0:
            value = value[()]
        if self._info is not None:
            if not _is_integer(value):
                raise self.reject(value, "takes an integer")
            if not self._info.min <= int(value) <= self._info.max:
                raise self.reject(value, f"holds {self._info.min}..{self._info.max}; {int(value)} is out of range")
            return np.array(int(value), self.dtype).tobytes()
        if not isinstance(value, numbers.Real):
            raise self.reject(value, "takes a real number")
        try:
            with np.errstate(over="raise"):
                return np.array(value, self.dtype).tobytes()
        except (FloatingPointError, OverflowError) as exc:
            raise self.reject(value, f"cannot hold {value!r} without overflow") from exc

    def decode_unchecked(self, data: Buffer) -> Any:
        if len(data) != self.size:
            raise ValueError(f"expected {self.size} bytes, got {len(data)}")
        return np.frombuffer(data, self.dtype)[0]

    def decode_block(self, block: npt.NDArray[np.uint8]) -> npt.NDArray[Any]:
        block = np.ascontiguousarray(block)
        values: npt.NDArray[Any] = block.view(self._dtype).reshape(block.shape[0])
        return values


class StrIntEncoding(Encoding):
    """``str_int``: an int of any size as decimal digits."""

    name = "str_int"

    def encode(self, value: Any) -> bytes:
        if isinstance(value, bool) or not _is_integer(value):
            raise self.reject(value, "takes an int")
        try:
            return str(int(value)).encode("ascii")
        except ValueError as exc:  # Python limits int <-> str conversions to 4300 digits
            raise self.reject(value, str(exc)) from exc

    def decode_unchecked(self, data: Buffer) -> int:
        return int(str(data, "utf-8"))


class StrFloatEncoding(Encoding):
    """``str_float``: a float as ``str(value)`` (its shortest round-tripping repr)."""

    name = "str_float"

    def encode(self, value: Any) -> bytes:
        if isinstance(value, bool) or not isinstance(value, numbers.Real) or isinstance(value, Decimal):
            raise self.reject(value, "takes a float")
        return str(float(value)).encode("ascii")

    def decode_unchecked(self, data: Buffer) -> float:
        return float(str(data, "utf-8"))


class StrDecimalEncoding(Encoding):
    """``str_decimal``: a ``decimal.Decimal`` as ``str(value)``."""

    name = "str_decimal"

    def encode(self, value: Any) -> bytes:
        if not isinstance(value, Decimal):
            raise self.reject(value, "takes a decimal.Decimal")
        return str(value).encode("ascii")

    def decode_unchecked(self, data: Buffer) -> Decimal:
        return Decimal(str(data, "utf-8"))
