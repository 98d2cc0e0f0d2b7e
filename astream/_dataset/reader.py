"""Reading one worker's samples of an epoch, shard downloads running ahead.

The worker's sample ids are mapped to (shard, offset) once, vectorised. Each shard is
*leased* for a stretch of the sequence: occurrences of a shard closer together than
the look-ahead (``predownload`` samples) share one lease, so a shard is pinned once
for the stretch where it is read, not once per sample. A prefetch task asks the node
agent for leases in order of their start as the consumer approaches them (at most
``max_concurrency`` requests in flight); the consumer waits only for the leases its
next batch needs, and releases each lease as soon as the sequence has passed its end.
Until the first batch can come from the cache, a batch may instead be read from the
remote by byte range (:mod:`astream._dataset.peek`), whichever comes first.

Shards are read through read-only memory maps, and every page of a map that a read
touched counts in the process's RSS until it is unmapped. The reader hands touched
pages back (``MADV_DONTNEED``: the data stays in the page cache and a later read maps
it again) once ``RESIDENT_BUDGET`` bytes were read, when a lease ends, and right after a
shard is opened (opening validates every record's head), so what iterating holds is a
few dozen megabytes, not the shards it has read.
"""

from __future__ import annotations

import asyncio
import heapq
from collections.abc import AsyncIterator, Awaitable, Callable
from typing import Any

import numpy as np
import numpy.typing as npt

from astream._arrays import group_positions, sorted_unique
from astream._coord.client import AsyncNodeClient
from astream._dataset.collate import collate_samples
from astream._dataset.layout import SampleMap
from astream._dataset.peek import PeekedRecords, RemotePeek
from astream._dataset.provider import shard_key
from astream._dataset.samples import SampleSteps
from astream._dataset.shards import RESIDENT_BUDGET, OpenShards, leases_of
from astream._format.gather import gather_batch
from astream._format.shard import ShardReader
from astream._sampling.defaults import lookahead
from astream._sampling.order import WorkerBatches
from astream.errors import AstreamError, TransformError

__all__ = ["CHUNK", "EpochReader", "StartAt"]

Int64Array = npt.NDArray[np.int64]

# Asked once before the first batch is read (a loader worker taking over from its
# stand-in, see :mod:`astream._dataset.handoff`): how many batches to skip because the
# consumer has them already, or -1 for none at all.
StartAt = Callable[[], Awaitable[int]]

# Samples per chunk of direct iteration (``for sample in ds``).
CHUNK = 64

class EpochReader:
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
        steps: what each sample goes through when it must be read one by one (a
            transform, a subclass's ``__getitem__``; see :mod:`astream._dataset.samples`).
        batch_transform: applied to each batch once collated.
    """

    def __init__(
        self,
        node: AsyncNodeClient,
        smap: SampleMap,
        order: WorkerBatches,
        predownload: int,
        max_concurrency: int,
        shards: OpenShards,
        peek: RemotePeek | None = None,
        steps: SampleSteps | None = None,
        batch_transform: Callable[[Any], Any] | None = None,
    ) -> None:
        self._node = node
        self._steps = steps
        self._batch_transform = batch_transform
        self._peek = peek
        # Read ahead only until the first batch comes from the cache: it buys the start of
        # an iteration its latency; later it would fetch bytes the download fetches again.
        self._reading_ahead = peek is not None
        self._smap = smap
        self._shards = shards
        self.order = order
        # Ids of a dropped last batch are never read, so never leased.
        self.ids = order.ids[: order.num_samples]
        self._shard, self._offset = smap.locate(self.ids)
        self._given_predownload = predownload
        self._predownload = 1
        empty = np.zeros(0, np.int64)
        self._lease_shard, self._lease_start, self._lease_end = empty, empty, empty
        self._ready: list[asyncio.Future[str]] = []
        self._issued = 0  # leases requested so far
        self._needed = 0  # leases the consumer has waited for
        self._releases: list[tuple[int, int]] = []  # heap of (end, lease) for requested leases
        self._paths: dict[int, str] = {}
        self._progress = asyncio.Event()
        self._consumed = 0
        self._slots = asyncio.Semaphore(max(1, max_concurrency))
        self._prefetch: asyncio.Task[None] | None = None
        self._held: set[int] = set()
        self._requests: set[asyncio.Task[None]] = set()
        # Mapped pages: the shards read since they were last handed back, and about how
        # many bytes (records of the shard's mean size).
        self._touched: set[int] = set()
        self._touched_bytes = 0.0
        self._mean_record = smap.mean_record_bytes

    async def __aenter__(self) -> EpochReader:
        return self

    def _begin(self, read_size: int) -> None:
        """Lease the sequence and start prefetching, once the size of one read is known."""
        if self._prefetch is not None or self._ready:
            raise RuntimeError("an EpochReader is iterated once")
        self._predownload = lookahead(self._given_predownload, read_size)
        self._lease_shard, self._lease_start, self._lease_end = leases_of(self._shard, self._predownload)
        loop = asyncio.get_running_loop()
        self._ready = [loop.create_future() for _ in range(len(self._lease_shard))]
        self._prefetch = loop.create_task(self._run_prefetch())

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    async def aclose(self) -> None:
        task, self._prefetch = self._prefetch, None
        pending = [t for t in (task, *self._requests) if t is not None]
        try:
            for t in pending:
                t.cancel()
            if pending:
                await asyncio.gather(*pending, return_exceptions=True)
            for lease in sorted(self._held):
                await self._node.unpin(self._key(lease))
            self._held.clear()
            if self._peek is not None:
                await self._peek.aclose()
        finally:  # also when this close is cancelled itself (a loop shutting down)
            for fut in self._ready:
                if not fut.done():
                    fut.cancel()
                elif not fut.cancelled():
                    fut.exception()  # retrieved: an error nobody waited for is not an error

    def _key(self, lease: int) -> str:
        g = int(self._lease_shard[lease])
        return shard_key(self._smap.shard_stream[g], self._smap.shard_local[g])

    async def _run_prefetch(self) -> None:
        starts = self._lease_start
        total = len(starts)
        loop = asyncio.get_running_loop()
        while self._issued < total:
            lease = self._issued
            while starts[lease] > self._consumed + self._predownload:
                self._progress.clear()
                await self._progress.wait()
            if self._lease_end[lease] < self._consumed:
                # Passed before it was asked for (a worker that starts mid-way): no request.
                self._issued += 1
                if not self._ready[lease].done():
                    self._ready[lease].set_result("")
                continue
            await self._slots.acquire()
            self._issued += 1
            task = loop.create_task(self._request(lease))
            self._requests.add(task)
            task.add_done_callback(self._requests.discard)

    async def _request(self, lease: int) -> None:
        future = self._ready[lease]
        try:
            path = await self._node.ensure(self._key(lease), pin=True)
        except BaseException as exc:
            if not future.done():
                if isinstance(exc, Exception):
                    future.set_exception(exc)
                else:
                    future.cancel()
            if not isinstance(exc, Exception):
                raise
        else:
            self._held.add(lease)
            heapq.heappush(self._releases, (int(self._lease_end[lease]), lease))
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
        shards still downloading from the remote (:mod:`astream._dataset.peek`), whichever
        is first. Returns the records read ahead, by shard (empty: all from the cache)."""
        peek = self._peek
        if peek is None or not self._reading_ahead:
            await self._ready_until(b)
            return {}
        pending = self._pending(a, b)
        shards = self._shard[a:b]
        offsets = self._offset[a:b]
        if pending:
            present = set(shards.tolist())
            pending = {shard: lease for shard, lease in pending.items() if shard in present}
        if not pending or not all(peek.can(shard) for shard in pending):
            self._reading_ahead = False
            await self._ready_until(b)
            return {}
        reads = {shard: asyncio.ensure_future(peek.records(shard, offsets[shards == shard])) for shard in pending}
        ready = [self._ready[lease] for lease in pending.values()]
        gathered = asyncio.gather(*reads.values())
        # Its outcome is read below or not at all (cancelled: a CancelledError nobody wants).
        gathered.add_done_callback(_retrieve)
        try:
            # Whichever comes first: the records, or every shard they are in.
            waiting: set[asyncio.Future[Any]] = {gathered, *ready}
            while gathered in waiting and any(f in waiting for f in ready):
                _, waiting = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
            if gathered.done():
                peeked = {shard: r for shard, r in zip(reads, gathered.result(), strict=True) if r is not None}
                if len(peeked) == len(reads):
                    return peeked
        finally:
            gathered.cancel()  # the reads still running: the download was first
        self._reading_ahead = False
        await self._ready_until(b)
        return {}

    def _touch(self, a: int, b: int) -> None:
        """Positions ``a:b`` were read: count the bytes mapped for them."""
        shards = self._shard[a:b]
        first = int(shards[0])
        if shards[-1] == first and (b - a == 1 or (shards == first).all()):
            self._touched.add(first)
            self._touched_bytes += (b - a) * self._mean_record[first]
        else:
            uniq = sorted_unique(shards).tolist()
            self._touched.update(uniq)
            self._touched_bytes += float(self._mean_record[shards].sum())
        if self._touched_bytes >= RESIDENT_BUDGET:
            self._shards.drop_pages(self._touched)
            self._touched.clear()
            self._touched_bytes = 0.0

    async def _advance(self, position: int) -> None:
        """The consumer finished everything before ``position``: release passed leases."""
        self._consumed = position
        self._progress.set()
        while self._releases and self._releases[0][0] < position:
            _, lease = heapq.heappop(self._releases)
            self._held.discard(lease)
            shard = int(self._lease_shard[lease])
            if shard in self._touched:
                self._shards.drop_pages((shard,))
                self._touched.discard(shard)
            await self._node.unpin(self._key(lease))

    def _reader(self, shard: int, peeked: dict[int, PeekedRecords] | None = None) -> ShardReader | PeekedRecords:
        if peeked and shard in peeked:
            return peeked[shard]
        return self._shards.get(shard, self._paths[shard])

    def _read_batch(self, a: int, b: int, peeked: dict[int, PeekedRecords] | None = None) -> dict[str, Any]:
        shards = self._shard[a:b]
        offsets = self._offset[a:b]
        if shards[0] == shards[-1] and (shards == shards[0]).all():
            return self._reader(int(shards[0]), peeked).get_batch(offsets)
        uniq, groups = group_positions(shards)
        sources = [self._reader(int(g), peeked) for g in uniq.tolist()]
        return gather_batch(sources, groups, [offsets[idx] for idx in groups], b - a, f"shards {uniq.tolist()}")

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

    async def _batch(self, a: int, b: int, peeked: dict[int, PeekedRecords], collate: Any) -> Any:
        if self._steps is not None:
            batch = (collate or collate_samples)(await self._samples(a, b, peeked))
        elif collate is not None:
            batch = collate(self._read_each(a, b, peeked))
        else:
            batch = self._read_batch(a, b, peeked)
        if self._batch_transform is not None:
            batch = await asyncio.get_running_loop().run_in_executor(None, _apply, self._batch_transform, batch)
        return batch

    async def batches(
        self, collate: Callable[[list[dict[str, Any]]], Any] | None = None, *, start_at: StartAt | None = None,
    ) -> AsyncIterator[Any]:
        """Yield the worker's batches, as :attr:`order` bounds them.

        Without ``collate`` a batch is read column-wise (vectorised); with it, samples are
        read one by one and handed to ``collate`` as a list. ``start_at`` is asked once,
        before the first read, how many batches to skip (``-1``: all of them).
        """
        order = self.order
        bounds = order.bounds
        widest = int(np.diff(bounds).max()) if order.num_batches else 1
        self._begin(widest)
        first = 0
        if start_at is not None:
            first = await start_at()
            if first < 0:
                return
            if first:
                await self._advance(int(bounds[min(first, order.num_batches)]))
        for k in range(first, order.num_batches):
            a, b = int(bounds[k]), int(bounds[k + 1])
            batch = await self._batch(a, b, await self._fetch(a, b), collate)
            self._touch(a, b)
            await self._advance(b)
            yield batch

    async def chunks(self, chunk: int = CHUNK) -> AsyncIterator[list[dict[str, Any]]]:
        """Yield the sequence as lists of up to ``chunk`` samples (for the sync bridge)."""
        n = len(self.ids)
        self._begin(chunk)
        # The first sample leaves alone, then chunks double up to ``chunk``: the caller's
        # first sample does not wait for 63 more to be decoded.
        a, size = 0, 1
        while a < n:
            b = min(a + size, n)
            out = await self._samples(a, b, await self._fetch(a, b))
            self._touch(a, b)
            await self._advance(b)
            yield out
            a, size = b, min(chunk, size * 2)

    async def samples(self, chunk: int = CHUNK) -> AsyncIterator[dict[str, Any]]:
        """Yield the sequence one sample at a time."""
        n = len(self.ids)
        self._begin(chunk)
        for a in range(0, n, chunk):
            b = min(a + chunk, n)
            for sample in await self._samples(a, b, await self._fetch(a, b)):
                yield sample
            self._touch(a, b)
            await self._advance(b)


def _apply(fn: Callable[[Any], Any], batch: Any) -> Any:
    try:
        return fn(batch)
    except AstreamError:
        raise
    except Exception as exc:
        raise TransformError(f"Loader's batch_transform raised {type(exc).__name__}: {exc}") from exc


def _retrieve(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()
