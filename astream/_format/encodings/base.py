"""The interface every MDS column encoding implements.

An encoding turns one column value into bytes and back. Fixed-size encodings (the
numeric scalars, ``int``, and ``ndarray:DTYPE:SHAPE``) have no head entry in a record
and can decode a whole batch at once from a ``(n, size)`` block of bytes.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from typing import Any

import numpy as np
import numpy.typing as npt

from astream.errors import AstreamError, EncodingError, SampleError

__all__ = ["Buffer", "Encoding", "type_name"]

# What decoders accept: a slice of a shard, either copied bytes or a view of an mmap.
Buffer = bytes | bytearray | memoryview


def type_name(value: object) -> str:
    """A short type name for error messages (``numpy.int64``, ``str``)."""
    cls = type(value)
    module = cls.__module__
    return cls.__qualname__ if module == "builtins" else f"{module.split('.')[0]}.{cls.__qualname__}"


class Encoding(ABC):
    """One column encoding, immutable and shared between columns and shards.

    Attributes:
        name: the encoding string as index.json stores it (``"ndarray:float32:3,4"``).
        size: the encoded size in bytes of every value, or None for variable size.
        safe: False for encodings that can run code while decoding (``pkl``).
        dtype: for fixed-size numeric encodings, the little-endian dtype of one element.
        shape: for fixed-size numeric encodings, the shape of one value (``()`` for scalars).
    """

    name: str
    size: int | None = None
    safe: bool = True
    dtype: np.dtype[Any] | None = None
    shape: tuple[int, ...] | None = None

    @property
    def is_fixed(self) -> bool:
        """True if every value encodes to exactly ``size`` bytes (no head entry)."""
        return self.size is not None

    @property
    def batchable(self) -> bool:
        """True if :meth:`decode_block` can decode many values with one NumPy view."""
        return self.size is not None and self.dtype is not None and self.shape is not None

    @abstractmethod
    def encode(self, value: Any) -> bytes:
        """Encode one value.

        Raises:
            SampleError: the value has the wrong type, dtype or shape for this encoding.
        """

    @abstractmethod
    def decode_unchecked(self, data: Buffer) -> Any:
        """Decode one value; may raise any exception on bad bytes (callers wrap it)."""

    def decode(self, data: Buffer) -> Any:
        """Decode one value.

        Raises:
            EncodingError: the bytes are not a valid value of this encoding.
        """
        try:
            return self.decode_unchecked(data)
        except AstreamError:
            raise
        except Exception as exc:  # decoders use numpy, PIL, json, pickle: each has its own errors
            raise EncodingError(
                f"cannot decode {len(data)} bytes as {self.name!r} ({type(exc).__name__}: {exc})"
            ) from exc

    def decode_spans(self, view: memoryview, starts: list[int], ends: list[int]) -> list[Any]:
        """Decode the values at ``view[starts[k]:ends[k]]``; may raise like :meth:`decode_unchecked`.

        Encodings override this with a tighter loop where it pays (``bytes``, ``str``).
        """
        decode = self.decode_unchecked
        return [decode(view[a:b]) for a, b in zip(starts, ends, strict=True)]

    def decode_block(self, block: npt.NDArray[np.uint8]) -> npt.NDArray[Any]:
        """Decode ``n`` values from a C-contiguous ``(n, size)`` uint8 block in one step.

        Only for :attr:`batchable` encodings; the result owns its memory.
        """
        if self.dtype is None or self.shape is None:
            raise NotImplementedError(f"encoding {self.name!r} has no vectorised decoder")
        block = np.ascontiguousarray(block)
        return block.view(self.dtype).reshape((block.shape[0], *self.shape))

    def reject(self, value: object, why: str) -> SampleError:
        """A SampleError saying why ``value`` does not fit this encoding."""
        return SampleError(f"encoding {self.name!r} {why}, got {type_name(value)}")

    def __repr__(self) -> str:
        return f"<Encoding {self.name!r} size={self.size}>"
