"""Fetching a shard that is byte ranges of a source file (a Parquet row group's column chunks).

The shard's file is the ranges one after the other, each read with one ranged request
(retried by the storage's policy; ranges that touch are read as one). The last range is
the source file's footer: its digest was recorded when the index was built, so a file
that changed since (rewritten, appended to) is refused before any of its bytes are
written, naming the file.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import os
from collections.abc import Callable

import xxhash

from astream._format.index import SourceRanges
from astream._storage.base import Storage
from astream._storage.local import LocalStorage
from astream._storage.sink import BufferedSink, Sink
from astream.errors import AstreamError, DownloadError, SourceChangedError

__all__ = ["copy_ranges_from", "fetch_ranges"]

# A range is read in requests of at most this many bytes (a column chunk can be large).
_PIECE = 16 << 20


async def fetch_ranges(
    storage: Storage, url: str, source: SourceRanges, sink: Sink, on_bytes: Callable[[int], None] | None = None,
) -> None:
    """Write ``source``'s ranges of the object at ``url`` into ``sink``, in order.

    The footer (the last range) is checked before anything is written, so nothing of a
    changed file is kept (the first column bytes are read beside it).

    Raises:
        SourceChangedError: the footer differs from the one the index was built from, or
            the file has another size now.
        DownloadError: a ranged read failed for good.
    """
    start, end = source.ranges[-1]
    pieces = _pieces(source)
    if isinstance(storage, LocalStorage) and isinstance(sink, BufferedSink):
        await storage.copy_into(url, sink, functools.partial(_copy_local, url, source, pieces, sink))
        if on_bytes is not None:
            on_bytes(sink.received)
        return
    if sink.received:
        await sink.restart()
    # The first piece is read while the footer is, one round trip instead of two (the first
    # batch of a resume waits for it); nothing reaches the sink before the footer is checked.
    first = asyncio.ensure_future(storage.read_range(url, *pieces[0])) if pieces else None
    try:
        try:
            footer = await storage.read_range(url, start, end)
        except DownloadError as exc:
            size = await _size(storage, url)
            if size is not None and size != source.file_bytes:
                raise _changed(url, f"it has {size} bytes, the index says {source.file_bytes}") from exc
            raise
        if xxhash.xxh64(footer).hexdigest() != source.last_xxh64:
            raise _changed(url, "its footer differs")
        for k, (a, b) in enumerate(pieces):
            data = await first if k == 0 and first is not None else await storage.read_range(url, a, b)
            if on_bytes is not None:
                on_bytes(len(data))
            await sink.write(data)
    finally:
        if first is not None and not first.done():
            first.cancel()
            with contextlib.suppress(BaseException):
                await first
        elif first is not None and not first.cancelled():
            first.exception()  # retrieved: a failure after the footer's is not left unobserved
    if on_bytes is not None:
        on_bytes(len(footer))
    await sink.write(footer)


def copy_ranges_from(fd: int, url: str, source: SourceRanges, sink: BufferedSink) -> None:
    """:func:`fetch_ranges` from the open local file ``fd`` (the object at ``url``), on the
    calling thread: ``sink`` takes the bytes through :meth:`BufferedSink.consume_range`."""
    _copy_local(url, source, _pieces(source), sink, fd)


def _pieces(source: SourceRanges) -> list[tuple[int, int]]:
    """The requests that read ``source``'s ranges but its footer (touching ranges joined)."""
    return [(piece, min(b, piece + _PIECE)) for a, b in _joined(list(source.ranges[:-1])) for piece in range(a, b, _PIECE)]


def _copy_local(url: str, source: SourceRanges, pieces: list[tuple[int, int]], sink: BufferedSink, fd: int) -> None:
    """:func:`fetch_ranges` of a local file, in one job of the sink's thread (a kernel copy of
    each range where the bytes go to the cache unchanged): the footer is read and checked
    first, then the pieces are copied, then the checked footer written."""
    size = os.fstat(fd).st_size
    if size != source.file_bytes:
        raise _changed(url, f"it has {size} bytes, the index says {source.file_bytes}")
    start, end = source.ranges[-1]
    footer = os.pread(fd, end - start, start)
    if xxhash.xxh64(footer).hexdigest() != source.last_xxh64:
        raise _changed(url, "its footer differs")
    for a, b in pieces:
        if sink.consume_range(fd, a, b - a) != b - a:
            raise _changed(url, "it got shorter while read")
    sink.consume_data(footer)


def _joined(ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Ranges that touch merged (a row group's column chunks usually lie back to back): the
    same bytes, in fewer requests."""
    out: list[tuple[int, int]] = []
    for a, b in ranges:
        if out and out[-1][1] == a:
            out[-1] = (out[-1][0], b)
        else:
            out.append((a, b))
    return out


async def _size(storage: Storage, url: str) -> int | None:
    try:
        return (await storage.stat(url)).size
    except (AstreamError, OSError):
        return None


def _changed(url: str, what: str) -> SourceChangedError:
    return SourceChangedError(
        f"{url}: the file changed since its index was built ({what}); rebuild the index "
        "(`astream index` where one was written next to the data; otherwise a new run rebuilds "
        "it) and start the epoch again"
    )
