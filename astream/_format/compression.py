"""Compression codecs of MDS: ``zstd``, ``gz``, ``bz2``, ``br`` and ``snappy``.

An algorithm string is a family with an optional level (``"zstd:7"``). The file
extension is the family alone (``shard.00000.mds.zstd``). ``br`` and ``snappy`` need
the extras of the same name; they are imported only when used.

Decoding is always bounded (:class:`StreamDecoder`, which the one-shot
:meth:`Codec.decompress` runs too): output comes in windows and stops at the size the
index declares, so a stored file that expands to far more (a "bomb") costs that size
and ends in a :class:`~astream.errors.CompressionError` naming it.
"""

from __future__ import annotations

import bz2
import gzip
import mmap
import zlib
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import zstandard

from astream.errors import CompressionError, MissingExtraError

__all__ = ["WINDOW", "Codec", "StreamDecoder", "get_codec"]

# The most output a decoder holds before handing it on: small enough to stay in a core's
# L2 cache (and under malloc's mmap threshold), large enough that each write costs little.
WINDOW = 128 << 10
Buffer = bytes | bytearray | memoryview | mmap.mmap
Output = bytes | bytearray | memoryview
_GZ_INPUT = 64 << 10
_ZSTD_MIN_WINDOW = 1 << 23
_ZSTD_MAX_WINDOW = 1 << 27

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

    def decompress(self, data: Buffer, *, size: int, name: str = "<bytes>") -> bytes | bytearray:
        """Decompress ``data`` (``name`` for messages) to exactly ``size`` bytes, index.json's.

        In bounded steps (:class:`StreamDecoder`): a file that expands past ``size`` stops
        there, so it costs what the index declares, never what it expands to.

        Raises:
            CompressionError: the bytes are not valid for this codec, or decode to another size.
        """
        whole = self._whole(data, size)
        if whole is not None:
            return whole
        out = bytearray()
        decoder = StreamDecoder(self, out.extend, limit=size, name=name)
        decoder.decode(data)
        decoder.flush()
        if len(out) != size:
            raise CompressionError(f"{name}: decompresses to {len(out)} bytes, index.json says {size}; the file "
                                   "is corrupt or stale: delete it so it is fetched again")
        return out

    def _whole(self, data: Buffer, size: int) -> bytes | bytearray | None:
        """The complete decode in one call, tried first where the stored bytes themselves say
        they decode to exactly ``size`` (a zstd frame's content size, a snappy block's
        length): one buffer of the declared size, written in place. None: decode in steps
        (another size, several frames, or an error, which the steps then report)."""
        view = memoryview(data)
        try:
            if self.family == "zstd" and zstandard.frame_content_size(view) == size:
                decoder = zstandard.ZstdDecompressor(max_window_size=_zstd_window(size))
                return decoder.decompress(view, allow_extra_data=False)
            if self.family == "snappy" and _snappy_length(bytes(view[:5]), "") == size:
                out = bytearray(size)
                return out if _snappy().decompress_raw_into(view, out) == size else None
        except MissingExtraError:
            raise
        except Exception:  # zstd's and cramjam's errors: the steps say what is wrong
            return None
        return None

    def stream_decoder(self, emit: Callable[[Output], object], limit: int | None,
                       name: str = "<bytes>") -> StreamDecoder:
        """A decoder fed chunk by chunk (``decode(chunk)`` then ``flush()``), see :class:`StreamDecoder`."""
        return StreamDecoder(self, emit, limit=limit, name=name)


class StreamDecoder:
    """Sans-I/O incremental decoder that hands its output to ``emit`` in bounded windows.

    Every codec decodes in steps of at most :data:`WINDOW` bytes of output (zstd through
    its stream writer, gz, bz2 and br by each library's output bound; a snappy block's
    declared length is checked before it is decoded). Output past ``limit`` is refused as
    soon as it would be produced: a bomb costs the size the index declares.

    Args:
        codec: the codec of the input.
        emit: receives each window of output, in order (a file's write, a buffer's extend).
        limit: the most bytes the input may decode to (None: no bound on the total, only on
            each step; a scan that keeps nothing of the output).
        name: the file or URL, for messages.

    Raises:
        CompressionError: (from ``decode``/``flush``) invalid, truncated, or over ``limit``.
            Errors raised by ``emit`` pass through unchanged.
    """

    def __init__(self, codec: Codec, emit: Callable[[Output], object], *, limit: int | None = None,
                 name: str = "<bytes>") -> None:
        self.codec = codec
        self.name = name
        self.limit = limit
        self.produced = 0
        self._emit = emit
        self._obj: Any = None
        self._buffer = bytearray()  # snappy: one raw block, decoded at the end
        self._done = False  # bz2: the bytes after the last stream are not one (ignored)
        family = codec.family
        if family == "zstd":
            # The frame names its window, which the decoder allocates: bounded by the output.
            self._obj = zstandard.ZstdDecompressor(max_window_size=_zstd_window(limit)).stream_writer(
                _Window(self), write_size=WINDOW, write_return_read=True, closefd=False  # type: ignore[arg-type]
            )
        elif family == "gz":
            self._obj = zlib.decompressobj(wbits=31)
        elif family == "bz2":
            self._obj = bz2.BZ2Decompressor()
        elif family == "br":
            self._obj = _brotli().Decompressor()
        else:
            _snappy()  # the missing extra is reported before any byte is fed

    def _room(self) -> int:
        if self.limit is None:
            return WINDOW
        return max(1, min(WINDOW, self.limit - self.produced + 1))  # one byte past the limit shows it

    def output(self, data: Output) -> None:
        """Count ``data`` against the limit and hand it on (also zstd's writer's target)."""
        if not len(data):
            return
        self.produced += len(data)
        if self.limit is not None and self.produced > self.limit:
            raise CompressionError(f"{self.name}: decodes to more than the {self.limit} bytes index.json records "
                                   "(a corrupt or hostile file); refused before decoding the rest")
        self._emit(data)

    def _bad(self, exc: BaseException) -> CompressionError:
        return CompressionError(f"{self.name}: cannot decompress with {self.codec.algo!r} ({type(exc).__name__}: "
                                f"{exc}); the file is corrupt or truncated: delete it so it is fetched again")

    def decode(self, chunk: Buffer) -> None:
        """Feed the next ``chunk`` of input; its output goes to ``emit``."""
        family = self.codec.family
        if family == "zstd":
            try:
                self._obj.write(chunk)
            except zstandard.ZstdError as exc:
                raise self._bad(exc) from exc
        elif family == "gz":
            self._gz(chunk)
        elif family == "bz2":
            self._bz2(bytes(chunk))
        elif family == "br":
            self._br(chunk)
        else:
            self._snappy_feed(chunk)

    def flush(self) -> None:
        """End of input: the rest of the output goes to ``emit``; a truncated input raises.

        A zstd frame cut short is not detected here (its writer does not say): it decodes
        to fewer bytes than declared, which the caller's size check refuses.
        """
        family = self.codec.family
        if family == "zstd":
            try:
                self._obj.flush()
            except zstandard.ZstdError as exc:
                raise self._bad(exc) from exc
        elif family == "snappy":
            self._snappy_end()
        elif family == "br":
            if not self._obj.is_finished():
                raise CompressionError(f"{self.name}: br data ends in the middle of a stream (truncated file?)")
        elif not (self._done or self._obj.eof):
            raise CompressionError(f"{self.name}: {family} data ends in the middle of a stream (truncated file?)")

    def _gz(self, chunk: Buffer) -> None:
        # In slices: zlib copies the input it has not used yet (its unconsumed_tail) at
        # each bounded step, so a whole file at once would be copied once per window.
        view = memoryview(chunk)
        for at in range(0, len(view), _GZ_INPUT):
            self._gz_part(view[at : at + _GZ_INPUT])

    def _gz_part(self, data: bytes | memoryview) -> None:
        obj = self._obj
        while True:
            if obj.eof:  # a member ended: what follows is the next member (gzip's rule: or zeros)
                data = (obj.unused_data + bytes(data)).lstrip(b"\0")
                if not data:
                    return
                self._obj = obj = zlib.decompressobj(wbits=31)
            room = self._room()
            try:
                out = obj.decompress(data, room)
            except zlib.error as exc:
                raise self._bad(exc) from exc
            self.output(out)
            if obj.eof:  # the rest of the input is in unused_data (unconsumed_tail keeps a stale copy)
                data = b""
                continue
            data = obj.unconsumed_tail
            # Less than a window out and no input left: nothing more until the next chunk.
            if not data and len(out) < room:
                return

    def _bz2(self, data: bytes) -> None:
        obj = self._obj
        while not self._done:
            after_one = obj.eof
            if after_one:  # a stream ended: what follows is the next stream
                data = obj.unused_data + data
                if not data:
                    return
                self._obj = obj = bz2.BZ2Decompressor()
            try:
                out = obj.decompress(data, self._room())
            except (OSError, EOFError, ValueError) as exc:
                if after_one:  # bz2's own rule: trailing bytes that are not a stream are ignored
                    self._done = True
                    return
                raise self._bad(exc) from exc
            self.output(out)
            data = b""
            if obj.needs_input and not obj.eof:
                return

    def _br(self, data: Buffer) -> None:
        obj = self._obj
        try:
            out = obj.process(data, output_buffer_limit=self._room())
            self.output(out)
            # The bound is on each call's buffer (it may pass it by a block): empty input
            # then yields the rest, until a call yields nothing and more input is welcome.
            while not obj.is_finished() and (out or not obj.can_accept_more_data()):
                out = obj.process(b"", output_buffer_limit=self._room())
                self.output(out)
        except _brotli().error as exc:
            raise self._bad(exc) from exc

    def _snappy_feed(self, data: Buffer) -> None:
        # Checked before the input is kept: a block's length comes first, and its input
        # can be no longer than snappy's worst case for the size the index declares.
        limit = self.limit
        if limit is not None:
            declared = _snappy_length(bytes(self._buffer[:5]) + bytes(memoryview(data)[:5]), self.name)
            if declared is not None and declared > limit:
                raise CompressionError(f"{self.name}: a snappy block of {declared} bytes, index.json records "
                                       f"{limit} (a corrupt or hostile file); refused before decoding it")
            if len(self._buffer) + len(data) > 32 + limit + limit // 6:
                raise CompressionError(f"{self.name}: more snappy input than a block of {limit} bytes can take")
        self._buffer += data

    def _snappy_end(self) -> None:
        if _snappy_length(self._buffer, self.name) is None:
            raise CompressionError(f"{self.name}: snappy data ends inside its length (truncated file?)")
        try:
            out = memoryview(_snappy().decompress_raw(self._buffer))
        except Exception as exc:  # cramjam.DecompressionError
            raise self._bad(exc) from exc
        self._buffer = bytearray()
        self.output(out)  # one block, already whole (and no larger than the limit)


class _Window:
    """The file-like object zstd's stream writer writes decoded windows to."""

    __slots__ = ("_decoder",)

    def __init__(self, decoder: StreamDecoder) -> None:
        self._decoder = decoder

    def write(self, data: bytes) -> int:
        self._decoder.output(data)
        return len(data)


def _zstd_window(limit: int | None) -> int:
    """The largest window a frame may ask for: what ``limit`` bytes of output need (a power
    of two), 8 MiB at least (what level 19 writes when it cannot know the size), at most
    zstd's own default limit (128 MiB)."""
    window = _ZSTD_MAX_WINDOW if limit is None else max(_ZSTD_MIN_WINDOW, min(_ZSTD_MAX_WINDOW, limit))
    return 1 << (window - 1).bit_length()


def _snappy_length(buf: bytes | bytearray, name: str) -> int | None:
    """The length a snappy raw block declares (its varint preamble), or None if not all here."""
    value = 0
    for i, byte in enumerate(buf[:5]):
        value |= (byte & 0x7F) << (7 * i)
        if byte < 0x80:
            return value
    if len(buf) >= 5:
        raise CompressionError(f"{name}: not snappy data (its length preamble runs past 5 bytes)")
    return None


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

