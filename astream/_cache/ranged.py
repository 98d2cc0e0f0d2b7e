"""Fetching a shard that is byte ranges of a source file (a Parquet row group's column chunks).

The shard's file is the ranges one after the other, each read with one ranged request
(retried by the storage's policy). The last range is the source file's footer: its digest
was recorded when the index was built, so a file that changed since (rewritten, appended
to) is refused before its bytes are trusted, naming the file.
"""

from __future__ import annotations

import xxhash

from astream._format.index import SourceRanges
from astream._storage.base import Storage
from astream._storage.sink import Sink
from astream.errors import SourceChangedError

__all__ = ["fetch_ranges"]

# A range is read in requests of at most this many bytes (a column chunk can be large).
_PIECE = 16 << 20


async def fetch_ranges(storage: Storage, url: str, source: SourceRanges, sink: Sink) -> None:
    """Write ``source``'s ranges of the object at ``url`` into ``sink``, in order.

    Raises:
        SourceChangedError: the footer differs from the one the index was built from.
        DownloadError: a ranged read failed for good (the file may also be shorter now).
    """
    if sink.received:
        await sink.restart()
    last = len(source.ranges) - 1
    for k, (start, end) in enumerate(source.ranges):
        if k == last:
            data = await storage.read_range(url, start, end)
            if xxhash.xxh64(data).hexdigest() != source.last_xxh64:
                raise SourceChangedError(
                    f"{url}: the file changed since its index was built (its footer differs); "
                    "rebuild the index (`astream index` where one was written, else delete the "
                    "local cache's index.json) and start the epoch again"
                )
            await sink.write(data)
            continue
        for piece in range(start, end, _PIECE):
            await sink.write(await storage.read_range(url, piece, min(end, piece + _PIECE)))
