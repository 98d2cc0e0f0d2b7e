"""Compression codecs of MDS: ``zstd``, ``gz``, ``bz2``, ``br`` and ``snappy``.

An algorithm string is a family with an optional level (``"zstd:7"``). The file
extension is the family alone (``shard.00000.mds.zstd``). ``br`` and ``snappy`` need
the extras of the same name; they are imported only when used.
"""

from __future__ import annotations

import bz2
import gzip
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import zstandard

from astream.errors import CompressionError, MissingExtraError

__all__ = ["Codec", "StreamDecoder", "get_codec", "is_supported"]

# family -> (default level, lowest level, highest level); None: the family has no levels.
_LEVELS: dict[str, tuple[int, int, int] | None] = {
    "br": (11, 0, 11),
    "bz2": (9, 1, 9),
    "gz": (9, 0, 9),
    "snappy": None,
    "zstd": (3, 1, 22),
}


def _brotli() -> Any:
    try:
        import brotli
    except ImportError as exc:
        raise MissingExtraError("compression 'br'", "brotli", "brotli") from exc
    return brotli


def _snappy() -> Any:
    try:
        import cramjam
    except ImportError as exc:
        raise MissingExtraError("compression 'snappy'", "snappy", "cramjam") from exc
    return cramjam.snappy


def _zstd_decompress(data: bytes) -> bytes:
    # One-shot decoding needs the content size in the frame header; frames from other
    # writers may lack it, so fall back to the streaming decoder (which reads all frames).
    try:
        return zstandard.ZstdDecompressor().decompress(data)
    except zstandard.ZstdError:
        decoder = zstandard.ZstdDecompressor().decompressobj()
        out = decoder.decompress(data)
        if not decoder.eof:
            raise CompressionError("zstd data ends in the middle of a frame (truncated file?)") from None
        rest = decoder.unused_data
        return out + (_zstd_decompress(rest) if rest else b"")


@dataclass(frozen=True)
class Codec:
    """One compression algorithm at one level.

    Attributes:
        algo: the full algorithm string as index.json records it (``"zstd:7"`` or ``"zstd"``).
        family: the family, which is also the file extension (``"zstd"``).
        level: the effective level, or None for families without levels.
    """

    algo: str
    family: str
    level: int | None

    @property
    def extension(self) -> str:
        """The suffix added to the raw file name (without the dot)."""
        return self.family

    def compress(self, data: bytes) -> bytes:
        """Compress ``data`` the way MosaicML Streaming's writer does."""
        if self.family == "zstd":
            assert self.level is not None
            # The content size goes into the frame header so readers can decode one-shot.
            return zstandard.ZstdCompressor(level=self.level, write_content_size=True).compress(data)
        if self.family == "gz":
            # mtime=0 makes the output reproducible (MosaicML's carries the write time).
            return gzip.compress(data, compresslevel=self.level if self.level is not None else 9, mtime=0)
        if self.family == "bz2":
            return bz2.compress(data, compresslevel=self.level if self.level is not None else 9)
        if self.family == "br":
            return bytes(_brotli().compress(data, quality=self.level))
        return bytes(_snappy().compress_raw(data))

    def decompress(self, data: bytes, name: str = "<bytes>") -> bytes:
        """Decompress ``data``; ``name`` (a file or URL) goes into the error message.

        Raises:
            CompressionError: the bytes are not valid for this codec.
        """
        try:
            return _DECOMPRESS[self.family](data)
        except MissingExtraError:
            raise
        except CompressionError as exc:
            raise CompressionError(f"{name}: cannot decompress with {self.algo!r}: {exc}") from exc
        except Exception as exc:  # every codec library has its own error types
            raise CompressionError(
                f"{name}: cannot decompress with {self.algo!r} ({type(exc).__name__}: {exc}); "
                "the file is corrupt or truncated: delete it so it is fetched again"
            ) from exc

    def stream_decoder(self) -> StreamDecoder:
        """A decoder fed chunk by chunk (``decode(chunk)`` then ``flush()``)."""
        return StreamDecoder(self)


_DECOMPRESS: dict[str, Callable[[bytes], bytes]] = {
    "zstd": _zstd_decompress,
    "gz": gzip.decompress,
    "bz2": bz2.decompress,
    "br": lambda data: bytes(_brotli().decompress(data)),
    "snappy": lambda data: bytes(_snappy().decompress_raw(data)),
}


class StreamDecoder:
    """Sans-I/O incremental decoder: ``decode(chunk) -> bytes`` then ``flush() -> bytes``.

    zstd, gz and bz2 decode incrementally; br and snappy (one raw block) buffer the
    input and decode it in ``flush``.
    """

    def __init__(self, codec: Codec) -> None:
        self.codec = codec
        self._buffer: list[bytes] = []
        self._obj: Any = None
        if codec.family == "zstd":
            self._obj = zstandard.ZstdDecompressor().decompressobj()
        elif codec.family == "gz":
            self._obj = zlib.decompressobj(wbits=31)
        elif codec.family == "bz2":
            self._obj = bz2.BZ2Decompressor()

    def decode(self, chunk: bytes) -> bytes:
        """Feed ``chunk``; returns whatever output it completes."""
        if self._obj is None:
            self._buffer.append(chunk)
            return b""
        try:
            return bytes(self._obj.decompress(chunk))
        except Exception as exc:
            raise CompressionError(f"cannot decompress with {self.codec.algo!r}: {exc}") from exc

    def flush(self) -> bytes:
        """End of input: returns the remaining output, or raises if the input was truncated."""
        if self._obj is None:
            return self.codec.decompress(b"".join(self._buffer))
        if self.codec.family == "gz":
            tail = bytes(self._obj.flush())
            if not self._obj.eof:
                raise CompressionError("gz data ends in the middle of a stream (truncated file?)")
            return tail
        if not self._obj.eof:
            raise CompressionError(f"{self.codec.family} data ends in the middle of a frame (truncated file?)")
        return b""


def get_codec(algo: str) -> Codec:
    """Parse an algorithm string (``"zstd"``, ``"zstd:7"``, ``"gz:1"``...).

    Raises:
        CompressionError: unknown family or a level out of range.
    """
    if not isinstance(algo, str):
        raise CompressionError(f"compression must be a string like 'zstd' or 'zstd:7', got {algo!r}")
    family, sep, level_text = algo.partition(":")
    if family not in _LEVELS:
        raise CompressionError(
            f"unknown compression {algo!r}: use one of {', '.join(sorted(_LEVELS))} "
            "(optionally with a level, like 'zstd:7')"
        )
    bounds = _LEVELS[family]
    if bounds is None:
        if sep:
            raise CompressionError(f"compression {family!r} takes no level, got {algo!r}")
        return Codec(algo, family, None)
    default, low, high = bounds
    if not sep:
        return Codec(algo, family, default)
    try:
        level = int(level_text)
    except ValueError:
        raise CompressionError(f"compression level in {algo!r} is not an integer") from None
    if not low <= level <= high or str(level) != level_text:
        raise CompressionError(f"compression level in {algo!r} must be an integer in {low}..{high}")
    return Codec(algo, family, level)


def is_supported(algo: str) -> bool:
    """True if ``algo`` parses (the extra it needs may still be missing)."""
    try:
        get_codec(algo)
    except CompressionError:
        return False
    return True
