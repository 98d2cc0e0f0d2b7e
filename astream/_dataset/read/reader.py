"""Reading one worker's samples of an epoch, shard downloads running ahead.

The worker's sample ids are mapped to (shard, offset) once, vectorised. Each shard is
*leased* for a stretch of the sequence: occurrences of a shard closer together than
the look-ahead (``predownload`` samples) share one lease, so a shard is pinned once
for the stretch where it is read, not once per sample. A prefetch task asks the node
agent for leases in order of their start as the consumer approaches them (at most
``max_concurrency`` requests in flight); the consumer waits only for the leases its
next batch needs, and releases each lease as soon as the sequence has passed its end.
A batch whose shard is still arriving is read from the file being written once its
records are there (:mod:`astream._dataset.read.arriving`), and checked against the installed
file when the shard's lease resolves. Until the first batch can come from the cache, a
batch may also be read from the remote by byte range (:mod:`astream._dataset.read.peek`),
whichever comes first: each an early source behind :mod:`astream._dataset.read.sources`.

With a bounded cache (``bounded=True``) a reader pins only what its current batch reads
(a lease is one run of a shard, requested once the batch it starts in is next), so the
node's readers can never hold more than one batch each; it tells the node agent its
shard uses and its position instead, and the node downloads ahead and evicts by next
use (:mod:`astream._node.provider`).

The loop is this module; each part it composes has its own module: the leases
(:class:`~astream._dataset.read.leases.LeaseBook`, asked for and released by
:class:`~astream._dataset.read.requests.LeaseRequests`), the early sources
(:class:`~astream._dataset.read.early_reads.EarlyReads`), the check of what they served
(:class:`~astream._dataset.read.checking.ServedChecks` over the
:class:`~astream._dataset.read.ledger.ServedLedger`) and the assembly of a batch
(:class:`~astream._dataset.read.assembly.Assembly`). Shards are read through read-only
memory maps whose touched pages are handed back as the reader goes
(:class:`~astream._dataset.read.shards.ResidentPages`).
"""

from __future__ import annotations

import asyncio
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import numpy as np
import numpy.typing as npt

from astream._coord.client import AsyncNodeClient
from astream._dataset.layout import SampleMap
from astream._dataset.observe.timings import STAGES
from astream._dataset.read.assembly import Assembly
from astream._dataset.read.checking import ServedChecks
from astream._dataset.read.collate import collate_samples
from astream._dataset.read.early_reads import EarlyReads
from astream._dataset.read.ledger import ServedLedger
from astream._dataset.read.records import PeekedRecords
from astream._dataset.read.requests import LeaseRequests
from astream._dataset.read.samples import SampleSteps, apply_batch_transform
from astream._dataset.read.shards import OpenShards, ResidentPages
from astream._dataset.read.sources import EarlySources
from astream._dataset.read.substitutes import BadSamples, ReaderSide, Substitutes
from astream._node.provider import shard_key
from astream._resource import AsyncResource
from astream._sampling.order import WorkerBatches
from astream.errors import ShardFormatError

__all__ = ["CHUNK", "EpochReader", "StartAt"]

Int64Array = npt.NDArray[np.int64]

# Asked once before the first batch is read (a loader worker taking over from its
# stand-in, see :mod:`astream._dataset.workers.handoff`): how many batches to skip because the
# consumer has them already, or -1 for none at all.
StartAt = Callable[[], Awaitable[int]]

# Samples per chunk of direct iteration (``for sample in ds``).
CHUNK = 64

# Reads of a batch whose shard files vanished from the cache, after the first.
_REFETCHES = 3


class EpochReader(AsyncResource, ReaderSide):
    """One worker's pass over its sample ids: leases, prefetch, and reading.

    Use ``async with``; iterate :meth:`batches` or :meth:`samples` once.

    Args:
        node: this process's client of the node agent.
        smap: where every global sample id lives.
        order: the worker's batches (its ids in order, padding dropped, and the batch
            bounds): what :mod:`astream._sampling.order` says this worker reads.
        predownload: how many samples ahead shards are requested (at least one read's worth).
        max_concurrency: shard requests in flight at once.
        shards: the process's open shard readers (shared across epochs).
        early: its early sources, as the dataset's source policy chose them for it (None:
            every batch waits for its leases; so with a bounded cache or in skip mode).
        steps: what each sample goes through when it must be read one by one (a
            transform, a subclass's ``__getitem__``; see :mod:`astream._dataset.read.samples`).
        batch_transform: applied to each batch once collated.
        bounded: the node's cache has a limit: pin one batch (``window`` positions) at a
            time and report the plan and position to the node agent.
        window: positions read at once (the batch size) when ``bounded``.
        bad_samples: skip mode's policy and known-bad ids (:mod:`~astream._dataset.read.substitutes`).
    """

    def __init__(
        self,
        node: AsyncNodeClient,
        smap: SampleMap,
        order: WorkerBatches,
        predownload: int,
        max_concurrency: int,
        shards: OpenShards,
        early: EarlySources | None = None,
        steps: SampleSteps | None = None,
        batch_transform: Callable[[Any], Any] | None = None,
        bounded: bool = False,
        window: int = 1,
        bad_samples: BadSamples | None = None,
    ) -> None:
        self._node = node
        self._steps = steps
        self._batch_transform = batch_transform
        self._bounded = bounded
        self._window = max(1, window)
        self._sources = early
        # What was served before its shard's install (the one record of it, its ledger), and
        # the check of it against the installed file (its failure stops the iteration).
        self._checks = ServedChecks(node, None if early is None else early.arriving,
                                    lambda lease: self._leases.key(lease))
        self._smap = smap
        self._shards = shards
        self.order = order
        # Ids of a dropped last batch are never read, so never leased.
        self.ids = order.ids[: order.num_samples]
        self._shard, self._offset = smap.locate(self.ids)
        self._pages = ResidentPages(shards, smap.mean_record_bytes)
        self._substitutes, leased = Substitutes.attach(self, bad_samples, smap)  # (None and the shards: raise)
        # The leases, asked for ahead of the consumer and released behind it.
        self._leases = LeaseRequests(node, smap, leased, predownload, max_concurrency, self._pages, bounded)
        self._assembly = Assembly(smap, shards, order.bounds, self._shard, self._offset, self._pages,
                                  self._leases.paths, bounded, self._readable_until)
        self._early = EarlyReads(smap, self._shard, self._offset, self._leases, self._checks, shards, early)

    def _begin(self, read_size: int) -> None:
        """Lease the sequence (and, unbounded, start asking for it), once one read's size is known."""
        self._leases.begin(read_size)
        if self._bounded:
            self._window = read_size

    async def aclose(self) -> None:
        pending = [*self._leases.tasks(), *self._checks.tasks()]
        try:
            for t in pending:
                t.cancel()
            if pending:
                await asyncio.gather(*pending, return_exceptions=True)
            await self._leases.release_all()
        finally:
            try:
                if self._sources is not None:
                    await self._sources.aclose()
            finally:
                self._leases.drop_futures()

    async def _fetch(self, a: int, b: int) -> dict[int, PeekedRecords]:
        """Make positions ``a:b`` readable (:meth:`EarlyReads.fetch`); the records read early,
        by shard (empty: all from the cache). A failed check of what was served before
        stops the iteration here."""
        self._checks.raise_failed()
        if self._assembly.covers(a, b):
            # Decoded already, from ready leases or from a run of a shard still arriving
            # (whose spans were noted, to check, when that run was served).
            return {}
        return await self._early.fetch(a, b)

    async def _samples(self, a: int, b: int, peeked: dict[int, PeekedRecords]) -> list[Any]:
        """Positions ``a:b`` as samples: read raw, or through the steps in an executor thread."""
        steps = self._steps
        if steps is None:
            return self._assembly.read_each(a, b, peeked)
        ids = self.ids[a:b].tolist()
        at = {sample: a + i for i, sample in enumerate(ids)}
        pinned = set(self._shard[a:b].tolist())

        def lookup(sample: int) -> dict[str, Any] | None:
            i = at.get(sample)
            if i is not None:
                return self._assembly.reader(int(self._shard[i]), peeked).get(int(self._offset[i]))
            shard, offset = self._smap.locate_one(sample)  # a neighbour: only from a whole shard held now
            path = self._leases.paths.get(shard) if shard in pinned else None
            return None if path is None else self._shards.get(shard, path).get(offset)

        return await asyncio.get_running_loop().run_in_executor(None, steps.run, ids, lookup)

    async def _batch(self, a: int, b: int, peeked: dict[int, PeekedRecords], collate: Any, k: int | None = None) -> Any:
        if self._steps is not None:
            with STAGES.timed("transform"):  # the steps read each sample and transform it
                samples = await self._samples(a, b, peeked)
            batch = STAGES.call("collate", collate or collate_samples, samples)
        elif collate is not None:
            batch = STAGES.call("collate", collate, STAGES.call("read", self._assembly.read_each, a, b, peeked))
        else:
            batch = STAGES.call("read", self._assembly.read_batch, a, b, peeked, k)
        if self._batch_transform is not None:
            with STAGES.timed("transform"):
                batch = await asyncio.get_running_loop().run_in_executor(None, apply_batch_transform,
                                                                         self._batch_transform, batch)
        return batch

    async def _read(self, read: Callable[..., Awaitable[Any]], a: int, b: int, *extra: Any) -> Any:
        """``read(a, b, peeked, *extra)`` once positions ``a:b`` are readable. A shard file the
        node gave this reader that cannot be opened any more (removed by a temp-folder cleaner
        or by hand after its install) is reported to the node, which fetches it again if it
        is gone, and the read is retried a few times (issue 31, item 2): the error path only."""
        for attempt in range(_REFETCHES + 1):
            peeked = await self._fetch(a, b)
            try:
                return await read(a, b, peeked, *extra)
            except ShardFormatError:
                paths = self._leases.paths
                shards = [g for g in map(int, np.unique(self._shard[a:b])) if g in paths and g not in peeked]
                if not shards or attempt == _REFETCHES:
                    raise
                for g in shards:
                    paths[g] = await self._node.refetch(shard_key(self._smap.shard_stream[g], self._smap.shard_local[g]))
        raise AssertionError("unreachable")

    async def batches(
        self, collate: Callable[[list[dict[str, Any]]], Any] | None = None, *, start_at: StartAt | None = None,
        served_first: ServedLedger | None = None,
    ) -> AsyncIterator[Any]:
        """Yield the worker's batches, as :attr:`order` bounds them.

        Without ``collate`` a batch is read column-wise (vectorised); with it, samples are
        read one by one and handed to ``collate`` as a list. ``start_at`` is asked once,
        before the first read, how many batches to skip (``-1``: all of them).
        ``served_first``: the first batch was handed out already, read from shards decoded
        before their install (:mod:`astream._dataset.start.early`), given as what it served: it is
        skipped, and each of those shards checked against its installed file like the
        samples this reader serves early.
        """
        order = self.order
        bounds = order.bounds
        widest = int(np.diff(bounds).max()) if order.num_batches else 1
        self._begin(widest)
        first = 0
        if served_first is not None and order.num_batches:
            self._early.take_over(served_first, int(bounds[1]))
            first = 1
        elif start_at is not None:
            first = await start_at()
            if first < 0:
                return
        if first:
            await self._leases.advance(int(bounds[min(first, order.num_batches)]))
        await self._leases.start()
        for k in range(first, order.num_batches):  # (skip mode: substitutes, the one point where bad samples go)
            a, b = int(bounds[k]), int(bounds[k + 1])
            batch = (await self._read(self._batch, a, b, collate, k) if (subs := self._substitutes) is None
                     else await subs.batch(a, b, collate, k))  # (batch k of the order)
            if not self._assembly.covers(a, b):  # (a window counts when it is read)
                self._pages.touched(self._shard[a:b])
            await self._leases.advance(b)
            yield batch
        await self._checks.settle()

    async def chunks(self, chunk: int = CHUNK) -> AsyncIterator[list[dict[str, Any]]]:
        """Yield the sequence as lists of up to ``chunk`` samples (for the sync bridge)."""
        n = len(self.ids)
        if self._bounded:
            chunk = min(chunk, self._window)
        self._begin(chunk)
        await self._leases.start()
        # The first sample leaves alone, then chunks double up to ``chunk``: the caller's
        # first sample does not wait for 63 more to be decoded.
        a, size = 0, 1
        while a < n:
            b = min(a + size, n)
            out = await self._read(self._samples, a, b)
            self._pages.touched(self._shard[a:b])
            await self._leases.advance(b)
            yield out
            a, size = b, min(chunk, size * 2)
        await self._checks.settle()

    async def samples(self, chunk: int = CHUNK) -> AsyncIterator[dict[str, Any]]:
        """Yield the sequence one sample at a time."""
        n = len(self.ids)
        if self._bounded:
            chunk = min(chunk, self._window)
        self._begin(chunk)
        await self._leases.start()
        for a in range(0, n, chunk):
            b = min(a + chunk, n)
            for sample in await self._read(self._samples, a, b):
                yield sample
            self._pages.touched(self._shard[a:b])
            await self._leases.advance(b)
        await self._checks.settle()
