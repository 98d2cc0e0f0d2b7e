"""Transfer slots: how many shard transfers run at once, handed out in plan order.

The limit moves (the AIMD controller of :mod:`astream._cache.throttle` sets it); a
waiter with a lower priority (an earlier reservation, i.e. a shard the consumer needs
sooner) is served first, so the next shard is never stuck behind later ones.
"""

from __future__ import annotations

import asyncio
import contextlib
import heapq
import itertools
from collections.abc import AsyncIterator

__all__ = ["Slots"]


class Slots:
    """A semaphore whose limit can change while in use; waiters are served by priority.

    Lower priorities (earlier reservations, i.e. plan order) go first, so the shard the
    consumer needs next is never stuck behind transfers of later shards.
    """

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.active = 0
        self._waiters: list[tuple[int, int, asyncio.Future[None]]] = []
        self._seq = itertools.count()
        self._moved: dict[int, int] = {}  # priorities raised by hurry(), for holds still to come

    def hurry(self, priority: int, to: int) -> None:
        """Serve the work of ``priority`` as if it had ``to`` (lower: sooner), whether it
        waits for a slot now or asks for one later (until :meth:`forget`)."""
        self._moved[priority] = to
        if any(p == priority for p, _, _ in self._waiters):
            self._waiters = [(to if p == priority else p, seq, fut) for p, seq, fut in self._waiters]
            heapq.heapify(self._waiters)

    def forget(self, priority: int) -> None:
        """The work of ``priority`` is over: drop what :meth:`hurry` noted for it."""
        self._moved.pop(priority, None)

    @contextlib.asynccontextmanager
    async def hold(self, priority: int = 0) -> AsyncIterator[None]:
        priority = self._moved.get(priority, priority)
        if self.active >= self.limit or self._waiters:
            fut = asyncio.get_running_loop().create_future()
            entry = (priority, next(self._seq), fut)
            heapq.heappush(self._waiters, entry)
            self.wake()
            try:
                await fut
            except BaseException:
                if fut.done() and not fut.cancelled():
                    self._release()  # we were handed a slot just as we got cancelled
                else:
                    # (by its future: hurry() may have replaced the entry)
                    self._waiters = [w for w in self._waiters if w[2] is not fut]
                    heapq.heapify(self._waiters)
                raise
        else:
            self.active += 1
        try:
            yield
        finally:
            self._release()

    def _release(self) -> None:
        self.active -= 1
        self.wake()

    def wake(self) -> None:
        while self._waiters and self.active < self.limit:
            _, _, fut = heapq.heappop(self._waiters)
            if not fut.done():
                self.active += 1
                fut.set_result(None)
