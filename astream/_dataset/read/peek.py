"""The ranged source: records of a shard read straight from the remote, before it has arrived.

A reader that needs samples of a shard still on its way would wait for the whole file:
64 MB is ~45 ms on loopback and a second or more on a cloud link, the largest part of a
cold first batch (and of a resume that lands on a shard not yet cached). An uncompressed
MDS shard can be read in place instead: its header gives every record's byte range, so
the few records a batch needs arrive in one or two ranged reads while the download of
the whole file goes on. The records are put into a small shard of their own and read by
:class:`~astream._format.shard.ShardReader`, so every check of the format layer applies
(:func:`~astream._dataset.read.records.small_shard`). The bytes come through the one
:class:`~astream._dataset.read.ranged.RangedReader`, with the engine's transfer settings.

It serves the start of an iteration: once a batch comes from the cache, the reader stops
reading ahead (later it would fetch bytes the download fetches anyway, and on a link that
is the bottleneck that costs throughput). Where it does not apply (the reader waits for
the download, as before; decided by :mod:`astream._dataset.read.policy`, this module's
budget aside):

- shards other than MDS (text formats, Parquet row groups, tars): they carry no header of
  record offsets;
- shards stored compressed on the remote (``zip_data``): there is no byte range to read;
- streams with ``validate_hash``: the records would be handed out before the file that
  holds them could be checked;
- beyond a quarter of a shard's bytes (at least one batch): past that the download is
  better spent, and a slow link would otherwise carry the shard twice;
- remotes other than a local directory in a loader's worker processes: importing the
  HTTP client there costs more time and memory than the download it would save;
- after any failure for a shard (a server without ranges, a header that disagrees with
  index.json, a network error): the download's own checks then report what is wrong.
"""

from __future__ import annotations

import asyncio
import logging
import struct
from collections.abc import Mapping

import numpy as np
import numpy.typing as npt
import xxhash

from astream._arrays import sorted_unique
from astream._dataset import tuning
from astream._dataset.layout import SampleMap
from astream._dataset.read.ledger import Span
from astream._dataset.read.policy import RANGED, EarlyTurns
from astream._dataset.read.ranged import RangedReader
from astream._dataset.read.records import PeekedRecords, check_head, coalesce, small_shard
from astream.errors import AstreamError, ShardFormatError

__all__ = ["RemotePeek"]

log = logging.getLogger("astream.peek")

Int64Array = npt.NDArray[np.int64]

_U32 = np.dtype("<u4")


class RemotePeek:
    """Ranged reads of the records a reader needs from shards it is still waiting for.

    Lives on one event loop (the reader's) and is closed with the reader.

    Args:
        smap: where every global shard's records live and how they decode.
        turns: the reader's early sources (which shards may be read, and turning them off).
        reader: the ranged reader of the dataset's remotes.
    """

    def __init__(self, smap: SampleMap, turns: EarlyTurns, reader: RangedReader) -> None:
        self._smap = smap
        self._turns = turns
        self._reader = reader
        self._heads: dict[int, Int64Array] = {}
        self._spent: dict[int, int] = {}

    def attempt(self, want: Mapping[int, Int64Array]) -> asyncio.Future[dict[int, PeekedRecords] | None] | None:
        """Read records ``want[shard]`` of each shard from the remote (see
        :class:`~astream._dataset.read.sources.ShardSource`); None if one may not be."""
        if not want or not all(self._turns.applies(RANGED, shard) for shard in want):
            return None
        reads: list[asyncio.Future[PeekedRecords | None]] = [
            asyncio.ensure_future(self.records(shard, offsets)) for shard, offsets in want.items()]
        return asyncio.ensure_future(_all(list(want), reads))

    async def records(self, shard: int, offsets: Int64Array) -> PeekedRecords | None:
        """Records ``offsets`` of global shard ``shard``, or None (then wait for the download)."""
        url = self._turns.policy.ranged_url(shard)
        if url is None:
            return None
        try:
            return await self._read(shard, url, offsets)
        except asyncio.CancelledError:
            raise
        except (AstreamError, OSError) as exc:
            self._turns.fail(RANGED, shard)
            log.debug("astream: reading %s ahead of its download failed (%s); waiting for the download", url, exc)
            return None

    async def _read(self, shard: int, url: str, offsets: Int64Array) -> PeekedRecords | None:
        info = self._smap.indexes[self._smap.shard_stream[shard]].shards[self._smap.shard_local[shard]]
        wanted = sorted_unique(offsets)
        head = self._heads.get(shard)
        prefix = b""
        header: list[Span] = []
        if head is None:
            head, prefix = await self._head(shard, url, info.samples, info.raw_data.bytes, int(wanted[-1]))
            length = 4 + 4 * (info.samples + 1)
            header.append((0, length, xxhash.xxh3_64_intdigest(prefix[:length])))
        begin, end = head[wanted], head[wanted + 1]
        spent = self._spent.get(shard, 0)
        if spent and spent + int((end - begin).sum()) > info.raw_data.bytes * tuning.READ_AHEAD.ranged_budget:
            self._turns.fail(RANGED, shard)  # the download is the cheaper way now
            return None
        # Ranges of records no more than ``coalesce_bytes`` apart, one request each; none for those
        # that came with the offset table.
        lo, hi = coalesce(begin, end)
        stream = int(self._smap.shard_stream[shard])
        fetched = [len(prefix)]

        async def read(a: int, b: int) -> bytes:
            first, stop = int(begin[a]), int(end[b - 1])
            if stop <= len(prefix):
                return prefix[first:stop]
            data = await self._reader.read_range(stream, url, first, stop)
            fetched.append(len(data))
            return data

        chunks = await asyncio.gather(*(read(int(a), int(b)) for a, b in zip(lo, hi, strict=True)))
        self._spent[shard] = self._spent.get(shard, 0) + sum(fetched)
        return small_shard(self._smap, shard, f"{url} (records read ahead of the download)", wanted, begin, end,
                           lo, hi, chunks, header)

    async def _head(self, shard: int, url: str, samples: int, size: int, last: int) -> tuple[Int64Array, bytes]:
        """The shard's offset table, checked against index.json, and the bytes read with it.

        When the records wanted (up to record ``last``) are likely to lie close behind the
        table (the start of a shard, as an unshuffled epoch reads it), they come in the same
        request: one round trip instead of two, which on a cloud link is most of the wait.
        """
        length = 4 + 4 * (samples + 1)
        if length > size:
            raise ShardFormatError(f"{url}: index.json's {samples} samples cannot fit its {size} bytes")
        # The records up to ``last`` at the shard's mean record size, with room for the
        # columns' JSON MosaicML writes after the table and for uneven records.
        guess = length + tuning.READ_AHEAD.speculate_slack + int((last + 1) * (size - length) / max(samples, 1) * 1.25)
        stop = guess if guess - length <= min(tuning.READ_AHEAD.speculate_bytes, size * tuning.READ_AHEAD.ranged_budget) else length
        raw = await self._reader.read_range(int(self._smap.shard_stream[shard]), url, 0, stop)
        (n,) = struct.unpack_from("<I", raw, 0)
        head = np.frombuffer(raw, _U32, samples + 1, 4).astype(np.int64)
        check_head(head, n, samples, size, url)
        self._heads[shard] = head
        return head, raw

    async def aclose(self) -> None:
        await self._reader.aclose()


async def _all(shards: list[int], reads: list[asyncio.Future[PeekedRecords | None]]) -> dict[int, PeekedRecords] | None:
    """Every read's records by shard, or None if one gave none (the reads still running cancelled)."""
    try:
        got = await asyncio.gather(*reads)
    finally:
        for read in reads:
            read.cancel()
    if any(r is None for r in got):
        return None
    return {shard: r for shard, r in zip(shards, got, strict=True) if r is not None}
