"""Image encodings: ``pil``, ``jpeg``, ``png``, ``jpeg_array`` and ``list[pil|jpeg|png]``.

Pillow is optional (the ``image`` extra) and imported on first use, so datasets
without image columns never need it. Decoded images are loaded eagerly: a corrupt
image then fails inside astream with an error that names the shard and sample,
instead of later in the user's code. A ``jpeg`` or ``png`` column is decoded by that
format's plugin alone (MosaicML lets Pillow guess: PNG, WebP or EPS in a ``jpeg``
column would be decoded too).

Byte layouts (all integers little-endian uint32):

- ``pil``: width, height, len(mode), mode (ASCII), then ``Image.tobytes()``.
- ``jpeg`` / ``png``: the image file's bytes (a JPEG opened from a file that still
  exists is copied from that file, with no re-encoding, as MosaicML Streaming does).
- ``jpeg_array``: count, count sizes, then the JPEG byte strings.
- ``list[X]``: 0 (reserved), count, count sizes, then each element encoded as ``X``.
"""

from __future__ import annotations

import io
import struct
from collections.abc import Sequence
from typing import Any

from astream._format.encodings.base import Buffer, Encoding
from astream.errors import MissingExtraError

__all__ = ["JPEGArrayEncoding", "JPEGEncoding", "ListEncoding", "PILEncoding", "PNGEncoding", "pil_image"]


def pil_image(feature: str) -> Any:
    """The ``PIL.Image`` module, or MissingExtraError naming ``feature``."""
    try:
        from PIL import Image
    except ImportError as exc:
        raise MissingExtraError(feature, "image", "PIL") from exc
    return Image


def _u32(data: Buffer, pos: int) -> int:
    if pos + 4 > len(data):
        raise ValueError(f"needs 4 bytes at {pos}, the value has {len(data)}")
    value: int = struct.unpack_from("<I", data, pos)[0]
    return value


class PILEncoding(Encoding):
    """``pil``: raw pixels with width, height and mode."""

    name = "pil"

    def encode(self, value: Any) -> bytes:
        image = pil_image(f"encoding {self.name!r}")
        if not isinstance(value, image.Image):
            raise self.reject(value, "takes a PIL.Image.Image")
        mode: bytes = value.mode.encode("utf-8")
        width, height = value.size
        pixels: bytes = value.tobytes()
        return struct.pack("<III", width, height, len(mode)) + mode + pixels

    def decode_unchecked(self, data: Buffer) -> Any:
        image = pil_image(f"encoding {self.name!r}")
        width, height, mode_len = struct.unpack_from("<III", data, 0)
        pixels = 12 + mode_len
        if pixels > len(data):
            raise ValueError(f"the mode needs {mode_len} bytes, the value has {len(data) - 12}")
        # A corrupt header must not make Pillow allocate gigabytes: every mode stores at
        # least one bit per pixel.
        if width * height > 8 * (len(data) - pixels):
            raise ValueError(f"{width}x{height} pixels cannot fit in {len(data) - pixels} bytes")
        mode = str(data[12:pixels], "utf-8")
        return image.frombytes(mode, (width, height), bytes(data[pixels:]))


class _FileImageEncoding(Encoding):
    """An image stored as a file in a Pillow format."""

    format: str

    def encode(self, value: Any) -> bytes:
        image = pil_image(f"encoding {self.name!r}")
        if not isinstance(value, image.Image):
            raise self.reject(value, "takes a PIL.Image.Image")
        out = io.BytesIO()
        try:
            value.save(out, format=self.format)
        except (OSError, ValueError, KeyError) as exc:  # e.g. "cannot write mode RGBA as JPEG"
            raise self.reject(value, f"cannot save this image as {self.format} ({exc})") from exc
        return out.getvalue()

    def decode_unchecked(self, data: Buffer) -> Any:
        image = pil_image(f"encoding {self.name!r}")
        # Only the declared format's plugin: a column of someone else's bytes must not
        # reach Pillow's other parsers (EPS runs Ghostscript where it is installed).
        opened = image.open(io.BytesIO(bytes(data)), formats=(self.format,))
        opened.load()
        return opened


class JPEGEncoding(_FileImageEncoding):
    """``jpeg``: JPEG file bytes (Pillow's default quality when it encodes)."""

    name = "jpeg"
    format = "JPEG"

    def encode(self, value: Any) -> bytes:
        # An image opened from a JPEG file is stored as that file, without re-encoding.
        pil_image(f"encoding {self.name!r}")
        from PIL.JpegImagePlugin import JpegImageFile

        filename = getattr(value, "filename", None)
        if filename and isinstance(value, JpegImageFile):
            try:
                with open(filename, "rb") as fh:
                    original: bytes = fh.read()
                    return original
            except FileNotFoundError:
                pass
        return super().encode(value)


class PNGEncoding(_FileImageEncoding):
    """``png``: PNG file bytes as Pillow saves them."""

    name = "png"
    format = "PNG"


def _sized_items(data: Buffer, pos: int) -> list[memoryview]:
    """Split ``count, sizes..., items...`` starting at ``pos`` into the items."""
    count = _u32(data, pos)
    pos += 4
    if pos + 4 * count > len(data):
        raise ValueError(f"{count} item sizes do not fit in {len(data)} bytes")
    sizes = struct.unpack_from(f"<{count}I", data, pos)
    pos += 4 * count
    if pos + sum(sizes) != len(data):
        raise ValueError(f"items of {sum(sizes)} bytes do not match the {len(data) - pos} bytes left")
    view = memoryview(data)
    items = []
    for size in sizes:
        items.append(view[pos : pos + size])
        pos += size
    return items


def _pack_items(items: Sequence[bytes], prefix: bytes = b"") -> bytes:
    head = struct.pack(f"<I{len(items)}I", len(items), *(len(item) for item in items))
    return b"".join((prefix, head, *items))


class JPEGArrayEncoding(Encoding):
    """``jpeg_array`` / ``jpegarray``: a list of ready-made JPEG byte strings."""

    def __init__(self, name: str = "jpeg_array") -> None:
        self.name = name
        self._jpeg = JPEGEncoding()

    def encode(self, value: Any) -> bytes:
        if not isinstance(value, (list, tuple)):
            raise self.reject(value, "takes a list of JPEG byte strings")
        if not value:
            # MosaicML Streaming cannot read back an empty jpeg_array; refuse to write one.
            raise self.reject(value, "cannot store an empty list (MosaicML Streaming cannot read it; use 'list[jpeg]')")
        items = []
        for item in value:
            if isinstance(item, (bytes, bytearray, memoryview)):
                items.append(bytes(item))
            else:  # a convenience MosaicML lacks: PIL images are saved as JPEG here
                items.append(self._jpeg.encode(item))
        return _pack_items(items)

    def decode_unchecked(self, data: Buffer) -> list[Any]:
        return [self._jpeg.decode_unchecked(item) for item in _sized_items(data, 0)]


class ListEncoding(Encoding):
    """``list[pil]``, ``list[jpeg]``, ``list[png]``: a list of images of one encoding."""

    def __init__(self, element: Encoding) -> None:
        self.name = f"list[{element.name}]"
        self._element = element

    def encode(self, value: Any) -> bytes:
        if not isinstance(value, (list, tuple)):
            raise self.reject(value, "takes a list of PIL images")
        return _pack_items([self._element.encode(item) for item in value], prefix=b"\0\0\0\0")

    def decode_unchecked(self, data: Buffer) -> list[Any]:
        if _u32(data, 0) != 0:
            raise ValueError("the reserved first word of a list is not 0")
        return [self._element.decode_unchecked(item) for item in _sized_items(data, 4)]
