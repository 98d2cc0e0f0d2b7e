"""The ``ndarray`` encoding: ``ndarray``, ``ndarray:DTYPE`` and ``ndarray:DTYPE:D0,D1,...``.

A record is, in order: one dtype-code byte (only when the dtype is not fixed by the
column), one byte ``(ndim << 2) | sc`` plus ``ndim`` shape integers of the smallest
unsigned type ``sc`` that holds the largest dimension (only when the shape is not
fixed), then the values in C order. With dtype and shape fixed the column has a fixed
size and whole batches decode as one NumPy view.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from astream._format.encodings.base import Buffer, Encoding
from astream.errors import EncodingError

__all__ = ["DTYPE_CODES", "NDArrayEncoding"]

# dtype name -> the one-byte code MDS stores when the dtype is dynamic.
DTYPE_CODES: dict[str, int] = {
    "uint8": 8, "int8": 9, "uint16": 16, "int16": 17, "float16": 18,
    "uint32": 32, "int32": 33, "float32": 34, "uint64": 64, "int64": 65, "float64": 66,
}
_CODE_DTYPES: dict[int, np.dtype[Any]] = {
    code: np.dtype(name).newbyteorder("<") for name, code in DTYPE_CODES.items()
}
# shape-integer code -> little-endian dtype; thresholds choose the smallest that fits.
_SHAPE_DTYPES = (np.dtype("<u1"), np.dtype("<u2"), np.dtype("<u4"), np.dtype("<u8"))
_MAX_NDIM = 63


def _shape_code(largest: int) -> int:
    if largest < 1 << 8:
        return 0
    if largest < 1 << 16:
        return 1
    if largest < 1 << 32:
        return 2
    return 3


class NDArrayEncoding(Encoding):
    """A numpy array of one of 11 dtypes, with optional fixed dtype and shape."""

    def __init__(self, dtype: str | None = None, shape: tuple[int, ...] | None = None) -> None:
        if shape is not None and dtype is None:
            raise EncodingError("ndarray encoding: a shape needs a dtype (use 'ndarray:DTYPE:SHAPE')")
        self._dtype_name = dtype
        self._fixed_dtype = None if dtype is None else np.dtype(dtype).newbyteorder("<")
        self._fixed_shape = shape
        parts = ["ndarray"]
        if dtype is not None:
            parts.append(dtype)
        if shape is not None:
            parts.append(",".join(map(str, shape)))
        self.name = ":".join(parts)
        if self._fixed_dtype is not None and shape is not None:
            self.size = math.prod(shape) * self._fixed_dtype.itemsize
            self.dtype = self._fixed_dtype
            self.shape = shape

    @classmethod
    def from_spec(cls, args: str | None) -> NDArrayEncoding:
        """Parse the part after ``ndarray:`` (``None`` for a bare ``ndarray``).

        Raises:
            EncodingError: unknown dtype, a dimension below 1, or too many parts.
        """
        if args is None:
            return cls()
        parts = args.split(":")
        if len(parts) > 2 or parts[0] not in DTYPE_CODES:
            raise EncodingError(
                f"'ndarray:{args}' is not an ndarray encoding: use 'ndarray', 'ndarray:DTYPE' or "
                f"'ndarray:DTYPE:D0,D1,...' with DTYPE one of {', '.join(DTYPE_CODES)}"
            )
        if len(parts) == 1:
            return cls(parts[0])
        try:
            shape = tuple(int(d) for d in parts[1].split(","))
        except ValueError:
            raise EncodingError(f"'ndarray:{args}': the shape must be integers like '3,224,224'") from None
        if not shape or min(shape) < 1 or len(shape) > _MAX_NDIM:
            raise EncodingError(f"'ndarray:{args}': every dimension must be >= 1 (at most {_MAX_NDIM} axes)")
        return cls(parts[0], shape)

    def encode(self, value: Any) -> bytes:
        if not isinstance(value, np.ndarray):
            raise self.reject(value, "takes a numpy.ndarray")
        name = value.dtype.name
        code = DTYPE_CODES.get(name)
        if code is None or value.dtype.kind not in "uif":
            raise self.reject(value, f"cannot store dtype {value.dtype} (supported: {', '.join(DTYPE_CODES)})")
        if self._dtype_name is not None and name != self._dtype_name:
            raise self.reject(value, f"takes dtype {self._dtype_name}, not {name}")
        if value.ndim == 0 or value.size == 0:
            raise self.reject(value, f"cannot store a 0-d or empty array (shape {value.shape})")
        if value.ndim > _MAX_NDIM:
            raise self.reject(value, f"takes at most {_MAX_NDIM} axes, not {value.ndim}")
        if self._fixed_shape is not None and value.shape != self._fixed_shape:
            raise self.reject(value, f"takes shape {self._fixed_shape}, not {value.shape}")
        if value.dtype.byteorder == ">":
            # MosaicML writes big-endian bytes under a little-endian code (they read back
            # wrong); store the values instead.
            value = value.astype(value.dtype.newbyteorder("<"))
        parts: list[bytes] = []
        if self._dtype_name is None:
            parts.append(bytes((code,)))
        if self._fixed_shape is None:
            sc = _shape_code(max(value.shape))
            parts.append(bytes(((value.ndim << 2) | sc,)))
            parts.append(np.array(value.shape, _SHAPE_DTYPES[sc]).tobytes())
        parts.append(value.tobytes())
        return b"".join(parts)

    def decode_unchecked(self, data: Buffer) -> np.ndarray[Any, Any]:
        pos = 0
        if self._fixed_dtype is None:
            dtype = _CODE_DTYPES.get(data[0])
            if dtype is None:
                raise ValueError(f"unknown dtype code {data[0]}")
            pos = 1
        else:
            dtype = self._fixed_dtype
        if self._fixed_shape is None:
            byte = data[pos]
            ndim, sc = byte >> 2, byte & 3
            if ndim == 0:
                raise ValueError("an array with 0 axes")
            end = pos + 1 + ndim * _SHAPE_DTYPES[sc].itemsize
            if end > len(data):
                raise ValueError(f"the shape needs {end} bytes, the value has {len(data)}")
            shape: tuple[int, ...] = tuple(np.frombuffer(data, _SHAPE_DTYPES[sc], ndim, pos + 1).tolist())
            pos = end
        else:
            shape = self._fixed_shape
        count = math.prod(shape)
        if count == 0 or (len(data) - pos) != count * dtype.itemsize:
            raise ValueError(f"shape {shape} of {dtype.name} needs {count * dtype.itemsize} bytes, got {len(data) - pos}")
        # Copy out of the shard buffer: the caller may keep the array after the shard closes.
        values: np.ndarray[Any, Any] = np.frombuffer(data, dtype, count, pos).reshape(shape).copy()
        return values
