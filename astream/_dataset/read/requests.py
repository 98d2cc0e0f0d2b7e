"""The :class:`~astream._dataset.read.leases.LeaseBook`'s I/O shell: requests to the node agent.

A prefetch task asks the node agent for the leases the book names, in order, at most
``max_concurrency`` at once, each resolving a future with its shard's installed path;
the consumer waits only for the leases its next batch needs, and releases each lease
(an ``unpin``) as soon as the sequence has passed its end. With a bounded cache the
reader's plan and position are reported to the node agent (``report_plan``,
``report_progress``, ``report_done``), which downloads ahead and evicts by next use.
"""

from __future__ import annotations

import asyncio
import itertools
import os

import numpy as np
import numpy.typing as npt

from astream._coord.client import AsyncNodeClient
from astream._dataset.layout import SampleMap
from astream._dataset.read.leases import LeaseBook
from astream._dataset.read.shards import ResidentPages
from astream._node.provider import encode_uses, shard_key
from astream._sampling.defaults import lookahead

__all__ = ["LeaseRequests"]

Int64Array = npt.NDArray[np.int64]


class LeaseRequests:
    """One reader's leases as requests: their futures, the prefetch task, the releases.

    Args:
        node: this process's client of the node agent.
        smap: where every global shard lives (its cache key).
        shard: the shard of each position of the reader's sequence.
        predownload: how many positions ahead shards are requested (at least one read's worth).
        max_concurrency: requests in flight at once.
        pages: the reader's touched pages (a released lease's are handed back).
        bounded: the node's cache has a limit (see :class:`LeaseBook`).
    """

    _names = itertools.count()

    def __init__(self, node: AsyncNodeClient, smap: SampleMap, shard: Int64Array, predownload: int,
                 max_concurrency: int, pages: ResidentPages, bounded: bool) -> None:
        self._node = node
        self._smap = smap
        self._shard = shard
        self._given_predownload = predownload
        self.predownload = 1
        self._pages = pages
        self._bounded = bounded
        self.name = f"{os.getpid()}.{next(LeaseRequests._names)}"
        self.book = LeaseBook(np.zeros(0, np.int64), 1, 1, bounded)  # (made once a read's size is known)
        self.ready: list[asyncio.Future[str]] = []
        self._needed = 0  # leases the consumer has waited for
        self.paths: dict[int, str] = {}  # per shard, the installed file of its ready lease
        self._progress = asyncio.Event()
        self._slots = asyncio.Semaphore(max(1, max_concurrency))
        self._prefetch: asyncio.Task[None] | None = None
        self._requests: set[asyncio.Task[None]] = set()

    def begin(self, read_size: int) -> None:
        """Lease the sequence and (unbounded) start prefetching, once one read's size is known."""
        if self._prefetch is not None or self.ready:
            raise RuntimeError("an EpochReader is iterated once")
        self.predownload = lookahead(self._given_predownload, read_size)
        self.book = LeaseBook(self._shard, self.predownload, read_size, self._bounded)
        loop = asyncio.get_running_loop()
        self.ready = [loop.create_future() for _ in range(len(self.book))]
        if not self._bounded:
            self._prefetch = loop.create_task(self._run_prefetch())

    async def start(self) -> None:
        """Bounded: report the plan and start requesting once iteration begins (a worker
        told to skip batches pins nothing before it knows)."""
        if self._prefetch is None and self._bounded:
            book = self.book
            uses = encode_uses(np.asarray(self._smap.shard_stream, np.int64)[book.shard],
                               np.asarray(self._smap.shard_local, np.int64)[book.shard])
            await self._node.report_plan(self.name, uses, book.start.tolist(), book.end.tolist(),
                                         window=self.predownload)
            self._node.report_progress(self.name, book.consumed)
            self._prefetch = asyncio.get_running_loop().create_task(self._run_prefetch())

    def tasks(self) -> list[asyncio.Task[None]]:
        """The prefetch task and the requests in flight (cancelled when the reader closes)."""
        task, self._prefetch = self._prefetch, None
        return [t for t in (task, *self._requests) if t is not None]

    async def release_all(self) -> None:
        """Unpin every lease still held (the reader closes)."""
        for lease in self.book.release_all():
            await self._node.unpin(self.key(lease))
        if self._bounded:
            self._node.report_done(self.name)

    def drop_futures(self) -> None:
        for fut in self.ready:
            if not fut.done():
                fut.cancel()
            elif not fut.cancelled():
                fut.exception()  # retrieved: an error nobody waited for is not an error

    def key(self, lease: int) -> str:
        g = int(self.book.shard[lease])
        return shard_key(self._smap.shard_stream[g], self._smap.shard_local[g])

    async def _run_prefetch(self) -> None:
        book = self.book
        loop = asyncio.get_running_loop()
        while not book.all_issued():
            while not book.due():
                self._progress.clear()
                await self._progress.wait()
            if book.next_passed():
                # Passed before it was asked for (a worker that starts mid-way): no request.
                lease = book.skip()
                if not self.ready[lease].done():
                    self.ready[lease].set_result("")
                continue
            await self._slots.acquire()
            lease, first = book.issue()
            task = loop.create_task(self._request(lease, first))
            self._requests.add(task)
            task.add_done_callback(self._requests.discard)

    async def _request(self, lease: int, first: bool = False) -> None:
        future = self.ready[lease]
        try:
            path = await self._node.ensure(self.key(lease), pin=True, first=first)
        except BaseException as exc:
            if not future.done():
                if isinstance(exc, Exception):
                    future.set_exception(exc)
                else:
                    future.cancel()
            if not isinstance(exc, Exception):
                raise
        else:
            self.book.granted(lease)
            if not future.done():
                future.set_result(path)
        finally:
            self._slots.release()

    async def ready_until(self, stop: int) -> None:
        """Wait for every lease that starts before position ``stop``."""
        starts = self.book.start
        while self._needed < len(starts) and starts[self._needed] < stop:
            lease = self._needed
            path = await self.ready[lease]
            if path:
                self.paths[int(self.book.shard[lease])] = path
            self._needed += 1

    def pending_in(self, a: int, b: int) -> dict[int, int]:
        """The leases not ready yet (by shard) of shards that positions ``a:b`` read; the
        paths of the ready ones are noted (a lease that failed raises its error here)."""
        pending: dict[int, int] = {}
        book = self.book
        lease = self._needed
        while lease < len(book) and book.start[lease] < b:
            future = self.ready[lease]
            shard = int(book.shard[lease])
            if not future.done():
                if book.end[lease] >= a:  # else passed while read ahead
                    pending[shard] = lease  # (a lease may span positions with none of its shard)
            elif path := future.result():
                self.paths[shard] = path
            lease += 1
        if pending:
            present = set(self._shard[a:b].tolist())
            pending = {shard: lease for shard, lease in pending.items() if shard in present}
        return pending

    def readable_until(self, stop: int) -> int:
        """The first position before ``stop`` a lease not ready yet may hold, else ``stop``.

        Every position before it is held by a ready lease (whose end is not passed, so its
        pin holds): those leases' paths are noted.
        """
        book = self.book
        lease = self._needed
        while lease < len(book) and book.start[lease] < stop:
            future = self.ready[lease]
            if not future.done() or future.cancelled() or future.exception() is not None:
                return int(book.start[lease])
            if path := future.result():
                self.paths[int(book.shard[lease])] = path
            lease += 1
        return stop

    async def advance(self, position: int) -> None:
        """The consumer finished everything before ``position``: release passed leases."""
        self.book.advance(position)
        self._progress.set()
        if self._bounded:
            self._node.report_progress(self.name, position)
        while (lease := self.book.next_release()) is not None:
            self._pages.release(int(self.book.shard[lease]))
            await self._node.unpin(self.key(lease))
