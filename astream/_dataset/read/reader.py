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
whichever comes first.

With a bounded cache (``bounded=True``) a reader pins only what its current batch reads
(a lease is one run of a shard, requested once the batch it starts in is next), so the
node's readers can never hold more than one batch each; it tells the node agent its
shard uses and its position instead, and the node downloads ahead and evicts by next
use (:mod:`astream._node.provider`).

Shards are read through read-only memory maps whose touched pages are handed back as
the reader goes (:class:`~astream._dataset.read.shards.ResidentPages`).
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import os
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import numpy as np
import numpy.typing as npt

from astream._arrays import group_positions
from astream._coord.client import AsyncNodeClient
from astream._dataset import tuning
from astream._dataset.layout import SampleMap
from astream._dataset.observe.timings import STAGES
from astream._dataset.read.ahead import DecodedAhead, decode_ahead
from astream._dataset.read.arriving import ArrivingShards
from astream._dataset.read.collate import collate_samples
from astream._dataset.read.grouping import BatchGroups
from astream._dataset.read.installed import check_installed
from astream._dataset.read.leases import LeaseBook
from astream._dataset.read.ledger import ServedLedger
from astream._dataset.read.peek import PeekedRecords, RemotePeek
from astream._dataset.read.samples import SampleSteps, apply_batch_transform
from astream._dataset.read.shards import OpenShards, ResidentPages
from astream._format.gather import gather_batch
from astream._format.kinds import SampleSource
from astream._format.record import RecordLayout
from astream._node.provider import encode_uses, shard_key
from astream._resource import AsyncResource
from astream._sampling.defaults import lookahead
from astream._sampling.order import WorkerBatches
from astream.errors import AstreamError, ServedSamplesError, ShardFormatError

__all__ = ["CHUNK", "EpochReader", "StartAt"]

Int64Array = npt.NDArray[np.int64]

# Asked once before the first batch is read (a loader worker taking over from its
# stand-in, see :mod:`astream._dataset.workers.handoff`): how many batches to skip because the
# consumer has them already, or -1 for none at all.
StartAt = Callable[[], Awaitable[int]]

# Samples per chunk of direct iteration (``for sample in ds``).
CHUNK = 64


_REFETCHES = 3  # reads of a batch whose shard files vanished from the cache, after the first


class EpochReader(AsyncResource):
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
        peek: reads the records of shards still downloading from the remote (None: wait).
        arriving: reads the records of shards still downloading from the cache's file
            being written (None: wait for the shard).
        steps: what each sample goes through when it must be read one by one (a
            transform, a subclass's ``__getitem__``; see :mod:`astream._dataset.read.samples`).
        batch_transform: applied to each batch once collated.
        bounded: the node's cache has a limit: pin one batch (``window`` positions) at a
            time and report the plan and position to the node agent.
        window: positions read at once (the batch size) when ``bounded``.
    """

    _names = itertools.count()

    def __init__(
        self,
        node: AsyncNodeClient,
        smap: SampleMap,
        order: WorkerBatches,
        predownload: int,
        max_concurrency: int,
        shards: OpenShards,
        peek: RemotePeek | None = None,
        arriving: ArrivingShards | None = None,
        steps: SampleSteps | None = None,
        batch_transform: Callable[[Any], Any] | None = None,
        bounded: bool = False,
        window: int = 1,
    ) -> None:
        self._node = node
        self._steps = steps
        self._batch_transform = batch_transform
        self._bounded = bounded
        self._window = max(1, window)
        self._name = f"{os.getpid()}.{next(EpochReader._names)}"
        # Bounded: no reading ahead by range, whose batches pass leases still in flight
        # (their pins would outlive the batch).
        self._peek = None if bounded else peek
        self._arriving = None if bounded else arriving
        # What was served before its shard's install (the one record of it), and per lease
        # whose shard owes something the check against the installed file (its failure
        # stops the iteration).
        self._ledger = ServedLedger()
        self._checks: dict[int, asyncio.Task[None]] = {}
        self._first_fetch = True
        # Read ahead only until the first batch comes from the cache: it buys the start of
        # an iteration its latency; later it would fetch bytes the download fetches again.
        self._reading_ahead = self._peek is not None
        # Row groups decoded ahead of their install may serve the first batches (not with a
        # bounded cache, for the same reason as reading ahead).
        self._offers_open = not bounded
        self._smap = smap
        self._shards = shards
        self.order = order
        # Ids of a dropped last batch are never read, so never leased.
        self.ids = order.ids[: order.num_samples]
        self._shard, self._offset = smap.locate(self.ids)
        self._groups: BatchGroups | None = None  # made at the first batch spanning shards
        # Batches decoded ahead (see astream._dataset.read.ahead): the current window, the
        # batches the next one may take, and the position before which none is tried.
        self._ahead: DecodedAhead | None = None
        self._ahead_batches = tuning.READ_AHEAD.first_batches
        self._ahead_off_until = 0
        self._given_predownload = predownload
        self._predownload = 1
        self._read_size = 1
        # The leases and where their requests stand (made once one read's size is known).
        self._book = LeaseBook(np.zeros(0, np.int64), 1, 1, bounded)
        self._lease_shard, self._lease_start, self._lease_end = self._book.shard, self._book.start, self._book.end
        self._ready: list[asyncio.Future[str]] = []
        self._needed = 0  # leases the consumer has waited for
        self._paths: dict[int, str] = {}
        self._progress = asyncio.Event()
        self._slots = asyncio.Semaphore(max(1, max_concurrency))
        self._prefetch: asyncio.Task[None] | None = None
        self._requests: set[asyncio.Task[None]] = set()
        self._pages = ResidentPages(shards, smap.mean_record_bytes)

    def _begin(self, read_size: int) -> None:
        """Lease the sequence and (unbounded) start prefetching, once one read's size is known."""
        if self._prefetch is not None or self._ready:
            raise RuntimeError("an EpochReader is iterated once")
        self._predownload = lookahead(self._given_predownload, read_size)
        self._read_size = read_size
        if self._bounded:
            self._window = read_size
        self._book = book = LeaseBook(self._shard, self._predownload, read_size, self._bounded)
        self._lease_shard, self._lease_start, self._lease_end = book.shard, book.start, book.end
        loop = asyncio.get_running_loop()
        self._ready = [loop.create_future() for _ in range(len(self._lease_shard))]
        if not self._bounded:
            self._prefetch = loop.create_task(self._run_prefetch())

    async def _start(self) -> None:
        """Bounded: report the plan and start requesting once iteration begins (a worker
        told to skip batches pins nothing before it knows)."""
        if self._prefetch is None and self._bounded:
            shards = self._lease_shard
            uses = encode_uses(np.asarray(self._smap.shard_stream, np.int64)[shards],
                               np.asarray(self._smap.shard_local, np.int64)[shards])
            await self._node.report_plan(self._name, uses, self._lease_start.tolist(), self._lease_end.tolist(),
                                         window=self._predownload)
            self._node.report_progress(self._name, self._book.consumed)
            self._prefetch = asyncio.get_running_loop().create_task(self._run_prefetch())

    async def aclose(self) -> None:
        task, self._prefetch = self._prefetch, None
        pending = [t for t in (task, *self._requests, *self._checks.values()) if t is not None]
        try:
            for t in pending:
                t.cancel()
            if pending:
                await asyncio.gather(*pending, return_exceptions=True)
            for lease in self._book.release_all():
                await self._node.unpin(self._key(lease))
            if self._bounded:
                self._node.report_done(self._name)
            if self._peek is not None:
                await self._peek.aclose()
        finally:
            if self._arriving is not None:
                self._arriving.close()  # also when this close is cancelled itself (a loop shutting down)
            for fut in self._ready:
                if not fut.done():
                    fut.cancel()
                elif not fut.cancelled():
                    fut.exception()  # retrieved: an error nobody waited for is not an error

    def _key(self, lease: int) -> str:
        g = int(self._lease_shard[lease])
        return shard_key(self._smap.shard_stream[g], self._smap.shard_local[g])

    async def _run_prefetch(self) -> None:
        book = self._book
        loop = asyncio.get_running_loop()
        while not book.all_issued():
            while not book.due():
                self._progress.clear()
                await self._progress.wait()
            if book.next_passed():
                # Passed before it was asked for (a worker that starts mid-way): no request.
                lease = book.skip()
                if not self._ready[lease].done():
                    self._ready[lease].set_result("")
                continue
            await self._slots.acquire()
            lease, first = book.issue()
            task = loop.create_task(self._request(lease, first))
            self._requests.add(task)
            task.add_done_callback(self._requests.discard)

    async def _request(self, lease: int, first: bool = False) -> None:
        future = self._ready[lease]
        try:
            path = await self._node.ensure(self._key(lease), pin=True, first=first)
        except BaseException as exc:
            if not future.done():
                if isinstance(exc, Exception):
                    future.set_exception(exc)
                else:
                    future.cancel()
            if not isinstance(exc, Exception):
                raise
        else:
            self._book.granted(lease)
            if not future.done():
                future.set_result(path)
        finally:
            self._slots.release()

    async def _ready_until(self, stop: int) -> None:
        """Wait for every lease that starts before position ``stop``."""
        starts = self._lease_start
        while self._needed < len(starts) and starts[self._needed] < stop:
            lease = self._needed
            path = await self._ready[lease]
            if path:
                self._paths[int(self._lease_shard[lease])] = path
            self._needed += 1

    def _pending(self, start: int, stop: int) -> dict[int, int]:
        """Leases of positions ``start:stop`` that are not ready yet, by shard; the paths of
        the ready ones are noted (a lease that failed raises its error here)."""
        pending: dict[int, int] = {}
        starts = self._lease_start
        lease = self._needed
        while lease < len(starts) and starts[lease] < stop:
            future = self._ready[lease]
            shard = int(self._lease_shard[lease])
            if not future.done():
                if self._lease_end[lease] >= start:  # else passed while read ahead
                    pending[shard] = lease  # (a lease may span positions with none of its shard)
            elif path := future.result():
                self._paths[shard] = path
            lease += 1
        return pending

    async def _fetch(self, a: int, b: int) -> dict[int, PeekedRecords]:
        """Make positions ``a:b`` readable: wait for their leases, or read the records of
        shards still downloading from their arriving file (:mod:`astream._dataset.read.arriving`)
        or the remote (:mod:`astream._dataset.read.peek`), whichever is first. Returns the
        records read early, by shard (empty: all from the cache)."""
        self._raise_failed_checks()
        if self._ahead is not None and self._ahead.covers(a, b):
            # Decoded already, from ready leases or from a run of a shard still arriving
            # (whose spans were noted, to check, when that run was served).
            return {}
        if self._offers_open and (offered := await self._from_offers(a, b)) is not None:
            return offered
        peek = self._peek if self._reading_ahead else None
        arriving = self._arriving
        if peek is None and arriving is None:
            await self._ready_until(b)
            return {}
        shards, offsets = self._shard[a:b], self._offset[a:b]
        pending = self._pending_in(a, b)
        first, self._first_fetch = self._first_fetch, False
        if pending and peek is None and arriving is not None and not first:
            # A shard about to land is read from the cache: serving from its arriving file
            # pays only where the wait would be long (a slow link, a shard still decoding,
            # the first batch of an iteration); for a wait of a few milliseconds the copies
            # and the contention with the download cost more than they save.
            await asyncio.wait([self._ready[lease] for lease in pending.values()], timeout=tuning.READ_AHEAD.grace_s)
            pending = self._pending_in(a, b)
        if pending and arriving is not None and (early := self._early(pending, shards, offsets)) is not None:
            self._reading_ahead = False  # the download is flowing: no more ranged reads
            return early
        if pending and peek is not None:
            peeked = await peek.race(shards, offsets, {s: self._ready[lease] for s, lease in pending.items()})
            if peeked is not None:
                self._served_early(pending, peeked)
                return peeked
        self._reading_ahead = False  # from the cache (or the download was first): no more ranged reads
        while pending and arriving is not None:
            await asyncio.wait([self._ready[lease] for lease in pending.values()], timeout=tuning.READ_AHEAD.poll_s)
            pending = self._pending_in(a, b)
            if pending and (early := self._early(pending, shards, offsets)) is not None:
                return early
        await self._ready_until(b)
        return {}

    async def _from_offers(self, a: int, b: int) -> dict[int, PeekedRecords] | None:
        """Positions ``a:b`` from row groups decoded before their install (a resume's first,
        :mod:`astream._dataset.preopen`), if their decoding ends before their leases resolve;
        each is checked against the installed file once its lease resolves (its failure
        stops the iteration). None: read as usual (the cache's readers then take those
        decodings where the installed bytes are the same)."""
        pending = self._pending_in(a, b)
        offers = {shard: self._shards.offered(shard) for shard in pending}
        if not pending or any(f is None for f in offers.values()):
            self._offers_open = not pending  # only the first batches of an iteration
            return None
        decoded = asyncio.gather(*(asyncio.wrap_future(f) for f in offers.values() if f is not None))
        decoded.add_done_callback(_retrieve)
        leases = [self._ready[lease] for lease in pending.values()]
        waiting: set[asyncio.Future[Any]] = {decoded, *leases}
        while decoded in waiting and any(f in waiting for f in leases):
            _, waiting = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
        if not decoded.done() or decoded.exception() is not None:
            return None  # the leases were first (or a decoding failed): read them from the cache
        out: dict[int, PeekedRecords] = {}
        for (shard, lease), (reader, digest) in zip(pending.items(), decoded.result(), strict=True):
            samples = self._smap.indexes[self._smap.shard_stream[shard]].shards[self._smap.shard_local[shard]].samples
            out[shard] = PeekedRecords(reader, np.arange(samples, dtype=np.int64), [])
            self._ledger.note_decoded(shard, digest)
            self._owe(lease)
        return out

    def _check_served(self, served: ServedLedger, stop: int) -> None:
        """Take over what ``served`` noted (a first batch handed out before this reader, before
        position ``stop``), each shard checked through its first lease."""
        self._ledger.merge(served)
        for shard in served.shards():
            leases = np.flatnonzero((self._lease_shard == shard) & (self._lease_start < stop))
            assert len(leases), f"shard {shard} holds none of the positions before {stop}"
            self._owe(int(leases[0]))

    def _owe(self, lease: int) -> None:
        """Check what the ledger holds of ``lease``'s shard once ``lease`` resolves."""
        if lease not in self._checks:
            task = asyncio.get_running_loop().create_task(self._check(lease))
            self._checks[lease] = task
            task.add_done_callback(functools.partial(self._check_done, lease))

    def _pending_in(self, a: int, b: int) -> dict[int, int]:
        """The pending leases (by shard) of shards that positions ``a:b`` read."""
        pending = self._pending(a, b)
        if pending:
            present = set(self._shard[a:b].tolist())
            pending = {shard: lease for shard, lease in pending.items() if shard in present}
        return pending

    def _early(self, pending: dict[int, int], shards: Int64Array, offsets: Int64Array) -> dict[int, PeekedRecords] | None:
        """The records of every pending shard from its arriving file, or None if one lacks them."""
        arriving = self._arriving
        assert arriving is not None
        # Only leases this reader asked for: its pin keeps the download going until the
        # lease resolves, and the lease's outcome is what the samples are checked against.
        if not all(lease < self._book.issued and arriving.applies(shard) for shard, lease in pending.items()):
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
            self._ledger.note_spans(shard, got.source, got.spans)
            self._owe(pending[shard])

    async def _check(self, lease: int) -> None:
        """Once ``lease`` resolves, check what the ledger holds of its shard against the file."""
        shard = int(self._lease_shard[lease])
        future = self._ready[lease]
        await asyncio.wait([future])  # (not cancelling the lease if this check is cancelled)
        try:
            path = future.result()  # a download that failed for good raises its error here
        except BaseException:
            self._forget(shard)
            raise
        if path:
            await self._verify(shard, path)
            return
        # Passed before this reader asked for it (all of it was served early): the shard is
        # still needed, to check what was served.
        key = self._key(lease)
        try:
            path = await self._node.ensure(key, pin=True)
        except BaseException:
            self._forget(shard)
            raise
        try:
            await self._verify(shard, path)
        finally:
            await self._node.unpin(key)

    async def _verify(self, shard: int, path: str) -> None:
        owed = self._ledger.take(shard)
        arriving = self._arriving
        try:
            if owed is not None:
                sources = {} if arriving is None else arriving.sources(shard)
                try:
                    await asyncio.to_thread(check_installed, owed, path, sources)
                except ServedSamplesError as exc:
                    if not isinstance(exc.__cause__, FileNotFoundError):
                        raise
                    # Removed since it was installed (a cleaner of the temporary folder): what
                    # was served is checked against the copy the node fetches again.
                    key = shard_key(self._smap.shard_stream[shard], self._smap.shard_local[shard])
                    await asyncio.to_thread(check_installed, owed, await self._node.refetch(key), sources)
        finally:
            if arriving is not None:
                arriving.release(shard)

    def _forget(self, shard: int) -> None:
        self._ledger.forget(shard)
        if self._arriving is not None:
            self._arriving.forget(shard)

    def _check_done(self, lease: int, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is None:
            # Passed: forgotten, so each batch looks only at the checks still open or failed.
            self._checks.pop(lease, None)

    def _raise_failed_checks(self) -> None:
        for task in self._checks.values():
            if task.done() and not task.cancelled() and task.exception() is not None:
                raise task.exception()  # type: ignore[misc]

    async def _settle_checks(self) -> None:
        """Before an iteration ends: every sample served early is checked."""
        if self._checks:
            await asyncio.gather(*self._checks.values())

    async def _advance(self, position: int) -> None:
        """The consumer finished everything before ``position``: release passed leases."""
        self._book.advance(position)
        self._progress.set()
        if self._bounded:
            self._node.report_progress(self._name, position)
        while (lease := self._book.next_release()) is not None:
            self._pages.release(int(self._lease_shard[lease]))
            await self._node.unpin(self._key(lease))

    def _reader(self, shard: int, peeked: dict[int, PeekedRecords] | None = None) -> SampleSource | PeekedRecords:
        if peeked and shard in peeked:
            return peeked[shard]
        return self._shards.get(shard, self._paths[shard])

    def _read_batch(self, a: int, b: int, peeked: dict[int, PeekedRecords] | None = None,
                    k: int | None = None) -> dict[str, Any]:
        done = self._ahead
        if done is not None:
            if not peeked and done.covers(a, b):
                return done.batch(a, b)
            self._ahead = None  # passed: its memory goes now, or to the next window
        shards = self._shard[a:b]
        offsets = self._offset[a:b]
        bounds = self.order.bounds
        if k is None:
            k = int(np.searchsorted(bounds, a, side="right")) - 1
        whole = 0 <= k < len(bounds) - 1 and bounds[k] == a and bounds[k + 1] == b  # one of the plan's batches
        if shards[0] == shards[-1] and (shards == shards[0]).all():
            shard = int(shards[0])
            # Variable-size columns cost a decode call per column and batch: a window pays it
            # once for many batches, also from one shard. Fixed-size rows of one shard are
            # one take already.
            layout = self._smap.layouts[shard]
            if (whole and isinstance(layout, RecordLayout) and layout.num_var
                    and (ahead := self._decode_ahead(k, done, peeked)) is not None):
                return ahead.batch(a, b)
            return self._reader(shard, peeked).get_batch(offsets)
        if whole:
            if (ahead := self._decode_ahead(k, done, peeked)) is not None:
                return ahead.batch(a, b)
            if self._groups is None:
                self._groups = BatchGroups(self._shard, self._offset, bounds)
            uniq, groups, parts = self._groups.groups(k)  # grouped for many batches at once
        else:
            return read_positions(shards, offsets, functools.partial(self._reader, peeked=peeked))
        sources = [self._reader(g, peeked) for g in uniq]
        return gather_batch(sources, groups, parts, b - a, f"shards {uniq}")

    def _decode_ahead(self, k: int, done: DecodedAhead | None,
                      peeked: dict[int, PeekedRecords] | None = None) -> DecodedAhead | None:
        """Batch ``k`` and the next ones decoded as one window, if that may be done now
        (``done``: the window before, whose memory it may reuse; ``peeked``: the records
        batch ``k`` was served early, by shard).

        Only positions held by ready leases (never with a bounded cache: its pins cover one
        batch) or by the runs of arriving shards batch ``k`` was served from, records of
        ``small_record`` bytes or less on average, within ``ahead_bytes``, and at least two
        batches; else None (batch by batch).
        """
        bounds = self.order.bounds
        a = int(bounds[k])
        if self._bounded or a < self._ahead_off_until:
            return None
        runs = {shard: got for shard, got in (peeked or {}).items() if got.run is not None}
        if peeked and len(runs) < len(peeked):
            return None  # (records from the remote, or a few of an arriving file: this batch alone)
        want = int(bounds[min(k + self._ahead_batches, len(bounds) - 1)])
        stop = self._readable_until(want)
        if runs:
            stop = self._in_runs_until(a, stop, want, runs)
        cost = np.cumsum(self._smap.mean_record_bytes[self._shard[a:stop]])
        if not len(cost) or cost[-1] > tuning.READ_AHEAD.small_record * len(cost):
            self._ahead_off_until = stop  # large records: a shard's fixed cost is small beside them
            return None
        stop = a + int(np.searchsorted(cost, tuning.READ_AHEAD.ahead_bytes, side="right"))
        last = int(np.searchsorted(bounds, stop, side="right")) - 1  # the last batch that fits ends there
        if last - k < 2:
            return None
        stop = int(bounds[last])
        offsets = self._offset[a:stop]
        if runs:
            # A run's records are entries 0, 1, ... of its small shard (offsets name
            # entries in the window's errors too).
            offsets = offsets.copy()
            in_window = self._shard[a:stop]
            for shard, got in runs.items():
                offsets[in_window == shard] -= got.run or 0

        def source(g: int) -> SampleSource:
            got = runs.get(g)
            return got.reader if got is not None else self._shards.get(g, self._paths[g])

        try:
            ahead = decode_ahead(self._smap.layouts, source, self._shard[a:stop], offsets, a, done)
        except AstreamError:
            ahead = None  # read batch by batch: the error comes with the batch it belongs to
        if ahead is None:
            self._ahead_off_until = stop
            return None
        self._pages.touched(self._shard[a:stop])
        self._ahead = ahead
        self._ahead_batches = min(2 * self._ahead_batches, tuning.READ_AHEAD.window)
        return ahead

    def _in_runs_until(self, a: int, readable: int, want: int, runs: dict[int, PeekedRecords]) -> int:
        """The first position of ``a:want`` a window may not read: one of a shard of ``runs``
        outside its run, or of another shard at or past ``readable`` (a lease not ready)."""
        shards, offsets = self._shard[a:want], self._offset[a:want]
        in_run = np.zeros(len(shards), bool)
        covered = np.zeros(len(shards), bool)
        for shard, got in runs.items():
            mine = shards == shard
            in_run |= mine
            covered[mine] = got.run_covers(offsets[mine])
        ok = np.where(in_run, covered, np.arange(a, want) < readable)
        bad = np.flatnonzero(~ok)
        return a + int(bad[0]) if len(bad) else want

    def _readable_until(self, stop: int) -> int:
        """The first position before ``stop`` a lease not ready yet may hold, else ``stop``.

        Every position before it is held by a ready lease (whose end is not passed, so its
        pin holds): those leases' paths are noted.
        """
        starts = self._lease_start
        lease = self._needed
        while lease < len(starts) and starts[lease] < stop:
            future = self._ready[lease]
            if not future.done() or future.cancelled() or future.exception() is not None:
                return int(starts[lease])
            if path := future.result():
                self._paths[int(self._lease_shard[lease])] = path
            lease += 1
        return stop

    def _read_each(self, a: int, b: int, peeked: dict[int, PeekedRecords]) -> list[dict[str, Any]]:
        return [self._reader(int(self._shard[i]), peeked).get(int(self._offset[i])) for i in range(a, b)]

    async def _samples(self, a: int, b: int, peeked: dict[int, PeekedRecords]) -> list[Any]:
        """Positions ``a:b`` as samples: read raw, or through the steps in an executor thread."""
        steps = self._steps
        if steps is None:
            return self._read_each(a, b, peeked)
        ids = self.ids[a:b].tolist()
        at = {sample: a + i for i, sample in enumerate(ids)}
        pinned = set(self._shard[a:b].tolist())

        def lookup(sample: int) -> dict[str, Any] | None:
            i = at.get(sample)
            if i is not None:
                return self._reader(int(self._shard[i]), peeked).get(int(self._offset[i]))
            shard, offset = self._smap.locate_one(sample)  # a neighbour: only from a whole shard held now
            path = self._paths.get(shard) if shard in pinned else None
            return None if path is None else self._shards.get(shard, path).get(offset)

        return await asyncio.get_running_loop().run_in_executor(None, steps.run, ids, lookup)

    async def _batch(self, a: int, b: int, peeked: dict[int, PeekedRecords], collate: Any, k: int | None = None) -> Any:
        if self._steps is not None:
            with STAGES.timed("transform"):  # the steps read each sample and transform it
                samples = await self._samples(a, b, peeked)
            batch = STAGES.call("collate", collate or collate_samples, samples)
        elif collate is not None:
            batch = STAGES.call("collate", collate, STAGES.call("read", self._read_each, a, b, peeked))
        else:
            batch = STAGES.call("read", self._read_batch, a, b, peeked, k)
        if self._batch_transform is not None:
            with STAGES.timed("transform"):
                batch = await asyncio.get_running_loop().run_in_executor(None, apply_batch_transform,
                                                                         self._batch_transform, batch)
        return batch

    async def _read(self, read: Callable[..., Awaitable[Any]], a: int, b: int, *extra: Any) -> Any:
        """``read(a, b, peeked, *extra)`` positions ``a:b`` once they are readable (:meth:`_fetch`). A shard file the
        node gave this reader that cannot be opened any more (removed by a cleaner of the
        temporary folder, or by hand, after the node installed it) is reported to the node,
        which looks at the disk, fetches it again if it is gone, and the read is tried again
        (issue 31, item 2; a few times, for a cleaner that keeps going): the error path only,
        nothing on the way of a batch."""
        for attempt in range(_REFETCHES + 1):
            peeked = await self._fetch(a, b)
            try:
                return await read(a, b, peeked, *extra)
            except ShardFormatError:
                shards = [int(g) for g in np.unique(self._shard[a:b]) if int(g) in self._paths and int(g) not in peeked]
                if not shards or attempt == _REFETCHES:
                    raise
                for g in shards:
                    key = shard_key(self._smap.shard_stream[g], self._smap.shard_local[g])
                    self._paths[g] = await self._node.refetch(key)
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
        before their install (:mod:`astream._dataset.early`), given as what it served: it is
        skipped, and each of those shards checked against its installed file like the
        samples this reader serves early.
        """
        order = self.order
        bounds = order.bounds
        widest = int(np.diff(bounds).max()) if order.num_batches else 1
        self._begin(widest)
        first = 0
        if served_first is not None and order.num_batches:
            self._check_served(served_first, int(bounds[1]))
            first = 1
        elif start_at is not None:
            first = await start_at()
            if first < 0:
                return
        if first:
            await self._advance(int(bounds[min(first, order.num_batches)]))
        await self._start()
        for k in range(first, order.num_batches):
            a, b = int(bounds[k]), int(bounds[k + 1])
            batch = await self._read(self._batch, a, b, collate, k)  # (batch k of the order)
            if self._ahead is None or not self._ahead.covers(a, b):  # (a window counts when it is read)
                self._pages.touched(self._shard[a:b])
            await self._advance(b)
            yield batch
        await self._settle_checks()

    async def chunks(self, chunk: int = CHUNK) -> AsyncIterator[list[dict[str, Any]]]:
        """Yield the sequence as lists of up to ``chunk`` samples (for the sync bridge)."""
        n = len(self.ids)
        if self._bounded:
            chunk = min(chunk, self._window)
        self._begin(chunk)
        await self._start()
        # The first sample leaves alone, then chunks double up to ``chunk``: the caller's
        # first sample does not wait for 63 more to be decoded.
        a, size = 0, 1
        while a < n:
            b = min(a + size, n)
            out = await self._read(self._samples, a, b)
            self._pages.touched(self._shard[a:b])
            await self._advance(b)
            yield out
            a, size = b, min(chunk, size * 2)
        await self._settle_checks()

    async def samples(self, chunk: int = CHUNK) -> AsyncIterator[dict[str, Any]]:
        """Yield the sequence one sample at a time."""
        n = len(self.ids)
        if self._bounded:
            chunk = min(chunk, self._window)
        self._begin(chunk)
        await self._start()
        for a in range(0, n, chunk):
            b = min(a + chunk, n)
            for sample in await self._read(self._samples, a, b):
                yield sample
            self._pages.touched(self._shard[a:b])
            await self._advance(b)
        await self._settle_checks()


def read_positions(shards: Int64Array, offsets: Int64Array,
                   source_of: Callable[[int], SampleSource | PeekedRecords]) -> dict[str, Any]:
    """The batch of records ``offsets`` of ``shards`` (position by position), each shard read
    through ``source_of(shard)``: one ``get_batch`` for one shard, else one gather."""
    if shards[0] == shards[-1] and (shards == shards[0]).all():
        return source_of(int(shards[0])).get_batch(offsets)
    found, groups = group_positions(shards)
    uniq = found.tolist()
    return gather_batch([source_of(g) for g in uniq], groups, [offsets[idx] for idx in groups], len(shards),
                        f"shards {uniq}")


def _retrieve(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()
