"""The early sources of one reader: records served before their shard's lease resolves.

A batch whose shards are not installed yet need not wait for them. In order, once per
batch, the reader's :class:`EarlyReads` tries the sources behind the seam of
:mod:`astream._dataset.read.sources`, each attempt raced against the lease
(:func:`~astream._dataset.read.sources.race`: the installed file wins whenever it is first):

1. a decoding offered before the install (a resume's first Parquet row groups,
   :class:`~astream._dataset.read.sources.DecodedOffers`), for the first batches only;
2. the records already written to the shard's arriving file
   (:mod:`astream._dataset.read.arriving`), after a grace once the first batch is served;
3. ranged reads from the remote (:mod:`astream._dataset.read.peek`), until a batch comes
   from the cache (later they would fetch bytes the download fetches anyway).

Which of them apply, and when each turns off, is the reader's
:class:`~astream._dataset.read.policy.EarlyTurns` (none with a bounded cache: its pins
cover one batch). Everything served is noted in the reader's
:class:`~astream._dataset.read.ledger.ServedLedger` and checked as its lease resolves
(:class:`~astream._dataset.read.checking.ServedChecks`).
"""

from __future__ import annotations

import asyncio

import numpy as np
import numpy.typing as npt

from astream._dataset import tuning
from astream._dataset.layout import SampleMap
from astream._dataset.read.checking import ServedChecks
from astream._dataset.read.ledger import ServedLedger
from astream._dataset.read.policy import ARRIVING, DECODED, RANGED
from astream._dataset.read.records import PeekedRecords
from astream._dataset.read.requests import LeaseRequests
from astream._dataset.read.shards import OpenShards
from astream._dataset.read.sources import DecodedOffers, EarlySources, race

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
        sources: the reader's early sources (None: none, its batches wait for their leases).
    """

    def __init__(self, smap: SampleMap, shard: Int64Array, offset: Int64Array, leases: LeaseRequests,
                 checks: ServedChecks, shards: OpenShards, sources: EarlySources | None) -> None:
        self._shard, self._offset = shard, offset
        self._leases = leases
        self._checks = checks
        self._sources = sources
        self._offers = DecodedOffers(smap, shards)

    async def fetch(self, a: int, b: int) -> dict[int, PeekedRecords]:
        """Make positions ``a:b`` readable: wait for their leases, or read the records of
        shards still downloading from an early source, whichever is first. Returns the
        records read early, by shard (empty: all from the cache)."""
        sources = self._sources
        if sources is None:
            await self._leases.ready_until(b)
            return {}
        turns = sources.turns
        if turns.on(DECODED) and (offered := await self._from_offers(a, b)) is not None:
            return offered
        ranged = sources.ranged if turns.on(RANGED) else None
        arriving = sources.arriving if turns.on(ARRIVING) else None
        if ranged is None and arriving is None:
            await self._leases.ready_until(b)
            return {}
        pending = self._leases.pending_in(a, b)
        first = turns.first_fetch()
        if pending and ranged is None and not first:
            # A shard about to land is read from the cache: serving from its arriving file
            # pays only where the wait would be long (a slow link, a shard still decoding,
            # the first batch of an iteration); for a wait of a few milliseconds the copies
            # and the contention with the download cost more than they save.
            await asyncio.wait(self._ready(pending), timeout=tuning.READ_AHEAD.grace_s)
            pending = self._leases.pending_in(a, b)
        if pending and (early := self._arrived(pending, a, b)) is not None:
            turns.stop(RANGED)  # the download is flowing: no more ranged reads
            return early
        if pending and ranged is not None and (attempt := ranged.attempt(self._want(pending, a, b))) is not None:
            peeked = await race(attempt, self._ready(pending))
            if peeked is not None:
                self._served_early(pending, peeked)
                return peeked
        turns.stop(RANGED)  # from the cache (or the download was first): no more ranged reads
        while pending and arriving is not None:
            await asyncio.wait(self._ready(pending), timeout=tuning.READ_AHEAD.poll_s)
            pending = self._leases.pending_in(a, b)
            if pending and (early := self._arrived(pending, a, b)) is not None:
                return early
        await self._leases.ready_until(b)
        return {}

    def _ready(self, pending: dict[int, int]) -> list[asyncio.Future[str]]:
        return [self._leases.ready[lease] for lease in pending.values()]

    def _want(self, pending: dict[int, int], a: int, b: int) -> dict[int, Int64Array]:
        """Per pending shard, the records of positions ``a:b`` it holds."""
        shards, offsets = self._shard[a:b], self._offset[a:b]
        return {shard: offsets[shards == shard] for shard in pending}

    async def _from_offers(self, a: int, b: int) -> dict[int, PeekedRecords] | None:
        """Positions ``a:b`` from row groups decoded before their install (a resume's first,
        :mod:`astream._dataset.start.preopen`), if their decoding ends before their leases resolve;
        each is checked against the installed file once its lease resolves (its failure
        stops the iteration). None: read as usual (the cache's readers then take those
        decodings where the installed bytes are the same)."""
        pending = self._leases.pending_in(a, b)
        attempt = self._offers.attempt(self._want(pending, a, b)) if pending else None
        if attempt is None:
            if pending:
                assert self._sources is not None
                self._sources.turns.stop(DECODED)  # only the first batches of an iteration
            return None
        out = await race(attempt, self._ready(pending))
        if out is None:
            return None  # the leases were first (or a decoding failed): read them from the cache
        for shard, lease in pending.items():
            self._checks.ledger.note_decoded(shard, self._offers.digests[shard])
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

    def _arrived(self, pending: dict[int, int], a: int, b: int) -> dict[int, PeekedRecords] | None:
        """The records of every pending shard from its arriving file, or None if one lacks them."""
        assert self._sources is not None
        arriving = self._sources.arriving
        # Only leases this reader asked for: its pin keeps the download going until the
        # lease resolves, and the lease's outcome is what the samples are checked against.
        if arriving is None or not all(lease < self._leases.book.issued for lease in pending.values()):
            return None
        done = arriving.attempt(self._want(pending, a, b))
        if done is None:
            return None
        out = done.result()
        assert out is not None
        self._served_early(pending, out)
        return out

    def _served_early(self, pending: dict[int, int], records: dict[int, PeekedRecords]) -> None:
        """Note what is handed out before its shard is installed, and check it once it is."""
        assert self._sources is not None
        arriving = self._sources.arriving
        for shard, got in records.items():
            if arriving is not None:
                arriving.note(shard, got)  # (its file stays open until the check)
            self._checks.ledger.note_spans(shard, got.source, got.spans)
            self._owe(pending[shard])
