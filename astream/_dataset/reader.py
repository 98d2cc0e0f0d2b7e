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

With a bounded cache (``bounded=True``) a reader pins only what its current batch reads
(a lease is one run of a shard, requested once the batch it starts in is next), so the
node's readers can never hold more than one batch each; it tells the node agent its
shard uses and its position instead, and the node downloads ahead and evicts by next
use (:mod:`astream._dataset.provider`).

Shards are read through read-only memory maps, and every page of a map that a read
touched counts in the process's RSS until it is unmapped. The reader hands touched
pages back (``MADV_DONTNEED``: the data stays in the page cache and a later read maps
it again) once ``RESIDENT_BUDGET`` bytes were read, when a lease ends, and right after a
shard is opened (opening validates every record's head), so what iterating holds is a
few dozen megabytes, not the shards it has read.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import heapq
import itertools
import mmap
import os
from collections import OrderedDict
from collections.abc import AsyncIterator, Awaitable, Callable, Iterable
from typing import Any

import numpy as np
import numpy.typing as npt

from astream._arrays import group_positions, sorted_unique
from astream._coord.client import AsyncNodeClient
from astream._dataset.layout import SampleMap
from astream._dataset.peek import PeekedRecords, RemotePeek
from astream._dataset.provider import encode_uses, shard_key
from astream._format.shard import ShardReader

__all__ = ["EpochReader", "OpenShards", "batch_start", "leases_of"]

Int64Array = npt.NDArray[np.int64]

# Set by a loader worker process: awaited when :meth:`EpochReader.batches` starts, it says how
# many batches to skip (the consumer already has them) or -1 for none at all.
batch_start: contextvars.ContextVar[Callable[[], Awaitable[int]] | None] = contextvars.ContextVar(
    "astream_batch_start", default=None
)

# Bytes read from mapped shards after which their touched pages are handed back.
RESIDENT_BUDGET = 32 << 20


def drop_pages(reader: ShardReader) -> None:
    """Unmap the pages of ``reader``'s file from this process (they stay in the page cache)."""
    buf = reader.buffer
    if isinstance(buf, mmap.mmap) and not buf.closed:
        with contextlib.suppress(OSError, ValueError):
            buf.madvise(mmap.MADV_DONTNEED)


def leases_of(shards: Int64Array, gap: int) -> tuple[Int64Array, Int64Array, Int64Array]:
    """Group the positions of each shard into leases.

    Args:
        shards: the shard of each position of the sequence.
        gap: occurrences of a shard at most this far apart share a lease.

    Returns:
        ``(shard, start, end)`` per lease, sorted by start; ``end`` is inclusive.
    """
    n = len(shards)
    if n == 0:
        empty = np.zeros(0, np.int64)
        return empty, empty, empty
    # Work on runs of one shard, not on positions: an unshuffled epoch of 200k samples is a
    # handful of runs (sorting every position took ~3 ms before the first batch). Positions
    # inside a run are 1 apart, so a run never splits; two runs of a shard share a lease
    # when the later one starts at most ``gap`` after the earlier one ends.
    change = np.flatnonzero(shards[1:] != shards[:-1]) + 1
    run_start = np.empty(len(change) + 1, np.int64)
    run_start[0] = 0
    run_start[1:] = change
    run_end = np.empty_like(run_start)
    run_end[:-1] = change - 1
    run_end[-1] = n - 1
    run_shard = shards[run_start]
    order = np.argsort(run_shard, kind="stable")  # by shard, then position (a stable sort keeps it)
    rs, rstart, rend = run_shard[order], run_start[order], run_end[order]
    new = np.ones(len(rs), bool)
    new[1:] = (rs[1:] != rs[:-1]) | (rstart[1:] - rend[:-1] > gap)
    first = np.flatnonzero(new)
    last = np.empty_like(first)
    last[:-1] = first[1:] - 1
    last[-1] = len(rs) - 1
    shard, start, end = rs[first], rstart[first], rend[last]
    by_start = np.argsort(start, kind="stable")
    return shard[by_start], start[by_start], end[by_start]


class OpenShards:
    """Readers of the shards this process reads, kept open (mmap) in LRU order."""

    def __init__(self, smap: SampleMap, max_open: int = 128) -> None:
        self._smap = smap
        self._max_open = max_open
        self._open: OrderedDict[int, ShardReader] = OrderedDict()

    def get(self, shard: int, path: str) -> ShardReader:
        reader = self._open.get(shard)
        if reader is not None:
            self._open.move_to_end(shard)
            return reader
        info = self._smap.indexes[self._smap.shard_stream[shard]].shards[self._smap.shard_local[shard]]
        reader = ShardReader.open(
            path, self._smap.layouts[shard], shard=info.index, expected_samples=info.samples
        )
        drop_pages(reader)  # opening read the first chunk of record heads
        self._open[shard] = reader
        while len(self._open) > self._max_open:
            # Dropped, not closed: a batch being decoded may still use it; the mapping
            # goes with the last reference.
            self._open.popitem(last=False)
        return reader

    def drop_pages(self, shards: Iterable[int]) -> None:
        """Hand back the touched pages of these shards (those still open)."""
        for shard in shards:
            reader = self._open.get(shard)
            if reader is not None:
                drop_pages(reader)

    def close(self) -> None:
        readers = list(self._open.values())
        self._open.clear()
        for reader in readers:
            with contextlib.suppress(Exception):
                reader.close()


class EpochReader:
    """One worker's pass over its sample ids: leases, prefetch, and reading.

    Use ``async with``; iterate :meth:`batches` or :meth:`samples` once.

    Args:
        node: this process's client of the node agent.
        smap: where every global sample id lives.
        ids: the worker's sample ids in order (padding already dropped).
        predownload: how many samples ahead shards are requested.
        max_concurrency: shard requests in flight at once.
        shards: the process's open shard readers (shared across epochs).
        peek: reads the records of shards still downloading from the remote (None: wait).
        bounded: the node's cache has a limit: pin one batch (``window`` positions) at a
            time and report the plan and position to the node agent.
        window: positions read at once (the batch size) when ``bounded``.
    """

    _names = itertools.count()

    def __init__(
        self,
        node: AsyncNodeClient,
        smap: SampleMap,
        ids: Int64Array,
        predownload: int,
        max_concurrency: int,
        shards: OpenShards,
        peek: RemotePeek | None = None,
        *,
        bounded: bool = False,
        window: int = 1,
    ) -> None:
        self._node = node
        self._bounded = bounded
        self._window = max(1, window)
        self._name = f"{os.getpid()}.{next(EpochReader._names)}"
        # Bounded: no reading ahead by range, whose batches pass leases still in flight
        # (their pins would outlive the batch).
        self._peek = None if bounded else peek
        # Read ahead only until the first batch comes from the cache: it buys the start of
        # an iteration its latency; later it would fetch bytes the download fetches again.
        self._reading_ahead = self._peek is not None
        self._smap = smap
        self._shards = shards
        self.ids = ids
        self._shard, self._offset = smap.locate(ids)
        self._predownload = max(1, predownload)
        # Bounded: one lease per run, so no pin outlives the batch that reads it.
        self._lease_shard, self._lease_start, self._lease_end = leases_of(
            self._shard, 0 if bounded else self._predownload
        )
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
        loop = asyncio.get_running_loop()
        self._ready = [loop.create_future() for _ in range(len(self._lease_shard))]
        if not self._bounded:
            self._prefetch = loop.create_task(self._run_prefetch())
        return self

    async def _start(self) -> None:
        """Bounded: report the plan and start requesting once iteration begins (a worker
        told to skip batches pins nothing before it knows)."""
        if self._prefetch is None and self._bounded:
            shards = self._lease_shard
            uses = encode_uses(np.asarray(self._smap.shard_stream, np.int64)[shards],
                               np.asarray(self._smap.shard_local, np.int64)[shards])
            await self._node.report_plan(self._name, uses, self._lease_start.tolist(), self._lease_end.tolist(),
                                         window=self._predownload)
            self._node.report_progress(self._name, self._consumed)
            self._prefetch = asyncio.get_running_loop().create_task(self._run_prefetch())

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
            if self._bounded:
                self._node.report_done(self._name)
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
            # Bounded: only leases that start in the batch about to be read.
            while starts[lease] > self._consumed + (self._window - 1 if self._bounded else self._predownload):
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
        if self._bounded:
            self._node.report_progress(self._name, position)
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
        parts = [(idx, self._reader(int(g), peeked).get_batch(offsets[idx])) for g, idx in zip(uniq, groups, strict=True)]
        return _scatter(parts, b - a)

    def _read_each(self, a: int, b: int, peeked: dict[int, PeekedRecords]) -> list[dict[str, Any]]:
        return [self._reader(int(self._shard[i]), peeked).get(int(self._offset[i])) for i in range(a, b)]

    async def batches(
        self, batch_size: int, drop_last: bool, collate: Callable[[list[dict[str, Any]]], Any] | None = None
    ) -> AsyncIterator[Any]:
        """Yield the sequence as batches of ``batch_size`` (the last one shorter unless dropped).

        Without ``collate`` a batch is read column-wise (vectorised); with it, samples are
        read one by one and handed to ``collate`` as a list.
        """
        n = len(self.ids)
        self._predownload = max(self._predownload, batch_size)  # a batch must fit the look-ahead
        self._window = batch_size
        stop_at = n - n % batch_size if drop_last else n
        first = 0
        hook = batch_start.get()
        if hook is not None:
            batch_start.set(None)  # for this reader only, not for any other the job opens
            first = await hook()
            if first < 0:
                return
            if first:
                await self._advance(min(first * batch_size, n))
        await self._start()
        for a in range(first * batch_size, stop_at, batch_size):
            b = min(a + batch_size, n)
            peeked = await self._fetch(a, b)
            batch = self._read_batch(a, b, peeked) if collate is None else collate(self._read_each(a, b, peeked))
            self._touch(a, b)
            await self._advance(b)
            yield batch

    async def chunks(self, chunk: int = 64) -> AsyncIterator[list[dict[str, Any]]]:
        """Yield the sequence as lists of up to ``chunk`` samples (for the sync bridge)."""
        n = len(self.ids)
        if self._bounded:
            chunk = min(chunk, self._window)
        self._predownload = max(self._predownload, chunk)
        await self._start()
        # The first sample leaves alone, then chunks double up to ``chunk``: the caller's
        # first sample does not wait for 63 more to be decoded.
        a, size = 0, 1
        while a < n:
            b = min(a + size, n)
            out = self._read_each(a, b, await self._fetch(a, b))
            self._touch(a, b)
            await self._advance(b)
            yield out
            a, size = b, min(chunk, size * 2)

    async def samples(self, chunk: int = 64) -> AsyncIterator[dict[str, Any]]:
        """Yield the sequence one sample at a time."""
        n = len(self.ids)
        if self._bounded:
            chunk = min(chunk, self._window)
        self._predownload = max(self._predownload, chunk)
        await self._start()
        for a in range(0, n, chunk):
            b = min(a + chunk, n)
            peeked = await self._fetch(a, b)
            for i in range(a, b):
                yield self._reader(int(self._shard[i]), peeked).get(int(self._offset[i]))
            self._touch(a, b)
            await self._advance(b)


def _retrieve(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()


def _scatter(parts: list[tuple[Int64Array, dict[str, Any]]], size: int) -> dict[str, Any]:
    """Put per-shard pieces of a batch back into sequence order."""
    out: dict[str, Any] = {}
    for name in parts[0][1]:
        values = [part[name] for _, part in parts]
        if all(isinstance(v, np.ndarray) for v in values) and len({(v.shape[1:], v.dtype) for v in values}) == 1:
            first = values[0]
            column = np.empty((size, *first.shape[1:]), first.dtype)
            for (idx, _), v in zip(parts, values, strict=True):
                column[idx] = v
            out[name] = column
        else:
            items: list[Any] = [None] * size
            for (idx, _), v in zip(parts, values, strict=True):
                for j, item in zip(idx.tolist(), list(v), strict=True):
                    items[j] = item
            out[name] = items
    return out
