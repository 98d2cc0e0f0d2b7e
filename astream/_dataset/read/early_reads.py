"""The early sources of one reader: records served before their shard's lease resolves.

A batch whose shards are not installed yet need not wait for them. In order, once per
batch, the reader's :class:`EarlyReads` tries (each a non-blocking attempt raced against
the lease, the lease's path winning whenever it comes first):

1. a decoding offered before the install (a resume's first Parquet row groups,
   :mod:`astream._dataset.start.preopen`), for the first batches of an iteration only;
2. the records already written to the shard's arriving file
   (:mod:`astream._dataset.read.arriving`), after a grace once the first batch is served;
3. ranged reads from the remote (:mod:`astream._dataset.read.peek`), until a batch comes
   from the cache (later they would fetch bytes the download fetches anyway).

Which of them apply is decided here once per reader (none with a bounded cache: its pins
cover one batch) and each turns itself off for the rest of the iteration when it stops
paying. Everything served is noted in the reader's
:class:`~astream._dataset.read.ledger.ServedLedger` and checked as its lease resolves
(:class:`~astream._dataset.read.checking.ServedChecks`).
"""

from __future__ import annotations

import asyncio
from typing import Any

import numpy as np
import numpy.typing as npt

from astream._dataset import tuning
from astream._dataset.layout import SampleMap
from astream._dataset.read.arriving import ArrivingShards
from astream._dataset.read.checking import ServedChecks
from astream._dataset.read.ledger import ServedLedger
from astream._dataset.read.peek import PeekedRecords, RemotePeek
from astream._dataset.read.requests import LeaseRequests
from astream._dataset.read.shards import OpenShards

__all__ = ["EarlyReads"]

Int64Array = npt.NDArray[np.int64]


class EarlyReads:
    """Where one reader's next batch may come from before its leases resolve.

    Args:
        smap: where every global shard's records live.
        shard, offset: the shard and record of each position of the reader's sequence.
        leases: the reader's lease requests (what is pending, and their futures).
        checks: the reader's served-bytes checks (its ledger).
        shards: the process's open shards (decodings offered before the install).
        peek: ranged reads of the remote (None: none).
        arriving: reads of arriving files (None: none).
        bounded: a bounded cache: no early source applies.
    """

    def __init__(self, smap: SampleMap, shard: Int64Array, offset: Int64Array, leases: LeaseRequests,
                 checks: ServedChecks, shards: OpenShards, peek: RemotePeek | None,
                 arriving: ArrivingShards | None, bounded: bool) -> None:
        self._smap = smap
        self._shard, self._offset = shard, offset
        self._leases = leases
        self._checks = checks
        self._shards = shards
        # Bounded: no reading ahead by range, whose batches pass leases still in flight
        # (their pins would outlive the batch).
        self._peek = None if bounded else peek
        self._arriving = None if bounded else arriving
        self._first_fetch = True
        # Read ahead only until the first batch comes from the cache: it buys the start of
        # an iteration its latency; later it would fetch bytes the download fetches again.
        self._reading_ahead = self._peek is not None
        # Row groups decoded ahead of their install may serve the first batches (not with a
        # bounded cache, for the same reason as reading ahead).
        self._offers_open = not bounded

    async def fetch(self, a: int, b: int) -> dict[int, PeekedRecords]:
        """Make positions ``a:b`` readable: wait for their leases, or read the records of
        shards still downloading from their arriving file (:mod:`astream._dataset.read.arriving`)
        or the remote (:mod:`astream._dataset.read.peek`), whichever is first. Returns the
        records read early, by shard (empty: all from the cache)."""
        if self._offers_open and (offered := await self._from_offers(a, b)) is not None:
            return offered
        peek = self._peek if self._reading_ahead else None
        arriving = self._arriving
        if peek is None and arriving is None:
            await self._leases.ready_until(b)
            return {}
        shards, offsets = self._shard[a:b], self._offset[a:b]
        pending = self._leases.pending_in(a, b)
        first, self._first_fetch = self._first_fetch, False
        if pending and peek is None and arriving is not None and not first:
            # A shard about to land is read from the cache: serving from its arriving file
            # pays only where the wait would be long (a slow link, a shard still decoding,
            # the first batch of an iteration); for a wait of a few milliseconds the copies
            # and the contention with the download cost more than they save.
            await asyncio.wait([self._leases.ready[lease] for lease in pending.values()], timeout=tuning.READ_AHEAD.grace_s)
            pending = self._leases.pending_in(a, b)
        if pending and arriving is not None and (early := self._early(pending, shards, offsets)) is not None:
            self._reading_ahead = False  # the download is flowing: no more ranged reads
            return early
        if pending and peek is not None:
            peeked = await peek.race(shards, offsets, {s: self._leases.ready[lease] for s, lease in pending.items()})
            if peeked is not None:
                self._served_early(pending, peeked)
                return peeked
        self._reading_ahead = False  # from the cache (or the download was first): no more ranged reads
        while pending and arriving is not None:
            await asyncio.wait([self._leases.ready[lease] for lease in pending.values()], timeout=tuning.READ_AHEAD.poll_s)
            pending = self._leases.pending_in(a, b)
            if pending and (early := self._early(pending, shards, offsets)) is not None:
                return early
        await self._leases.ready_until(b)
        return {}

    async def _from_offers(self, a: int, b: int) -> dict[int, PeekedRecords] | None:
        """Positions ``a:b`` from row groups decoded before their install (a resume's first,
        :mod:`astream._dataset.start.preopen`), if their decoding ends before their leases resolve;
        each is checked against the installed file once its lease resolves (its failure
        stops the iteration). None: read as usual (the cache's readers then take those
        decodings where the installed bytes are the same)."""
        pending = self._leases.pending_in(a, b)
        offers = {shard: self._shards.offered(shard) for shard in pending}
        if not pending or any(f is None for f in offers.values()):
            self._offers_open = not pending  # only the first batches of an iteration
            return None
        decoded = asyncio.gather(*(asyncio.wrap_future(f) for f in offers.values() if f is not None))
        decoded.add_done_callback(_retrieve)
        leases = [self._leases.ready[lease] for lease in pending.values()]
        waiting: set[asyncio.Future[Any]] = {decoded, *leases}
        while decoded in waiting and any(f in waiting for f in leases):
            _, waiting = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
        if not decoded.done() or decoded.exception() is not None:
            return None  # the leases were first (or a decoding failed): read them from the cache
        out: dict[int, PeekedRecords] = {}
        for (shard, lease), (reader, digest) in zip(pending.items(), decoded.result(), strict=True):
            samples = self._smap.indexes[self._smap.shard_stream[shard]].shards[self._smap.shard_local[shard]].samples
            out[shard] = PeekedRecords(reader, np.arange(samples, dtype=np.int64), [])
            self._checks.ledger.note_decoded(shard, digest)
            self._owe(lease)
        return out

    def take_over(self, served: ServedLedger, stop: int) -> None:
        """Take over what ``served`` noted (a first batch handed out before this reader, before
        position ``stop``), each shard checked through its first lease."""
        self._checks.ledger.merge(served)
        for shard in served.shards():
            leases = np.flatnonzero((self._leases.book.shard == shard) & (self._leases.book.start < stop))
            assert len(leases), f"shard {shard} holds none of the positions before {stop}"
            self._owe(int(leases[0]))

    def _owe(self, lease: int) -> None:
        """Check what the ledger holds of ``lease``'s shard once ``lease`` resolves."""
        self._checks.owe(lease, int(self._leases.book.shard[lease]), self._leases.ready[lease])

    def _early(self, pending: dict[int, int], shards: Int64Array, offsets: Int64Array) -> dict[int, PeekedRecords] | None:
        """The records of every pending shard from its arriving file, or None if one lacks them."""
        arriving = self._arriving
        assert arriving is not None
        # Only leases this reader asked for: its pin keeps the download going until the
        # lease resolves, and the lease's outcome is what the samples are checked against.
        if not all(lease < self._leases.book.issued and arriving.applies(shard) for shard, lease in pending.items()):
            return None
        out: dict[int, PeekedRecords] = {}
        for shard in pending:
            records = arriving.records(shard, offsets[shards == shard])
            if records is None:
                return None
            out[shard] = records
        self._served_early(pending, out)
        return out

    def _served_early(self, pending: dict[int, int], records: dict[int, PeekedRecords]) -> None:
        """Note what is handed out before its shard is installed, and check it once it is."""
        arriving = self._arriving
        if arriving is None:
            return  # (no peek either: both need a remote and no validate_hash)
        for shard, got in records.items():
            arriving.note(shard, got)
            self._checks.ledger.note_spans(shard, got.source, got.spans)
            self._owe(pending[shard])


def _retrieve(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()
