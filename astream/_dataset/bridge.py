"""The sync face of the async core: a private event-loop thread and a batch pump.

``for batch in loader`` runs the *same* async iterator that ``async for`` uses, on an
event loop owned by a daemon thread (anyio's blocking portal is the model). A pump
task pulls items from the async iterator and hands them over through a bounded
``queue.Queue``: one thread crossing per item (a whole batch), never per sample, and
the loop keeps producing while the caller computes.
"""

from __future__ import annotations

import asyncio
import contextlib
import queue
import threading
from collections.abc import AsyncIterator, Callable, Iterator
from contextlib import AbstractAsyncContextManager
from typing import Any, Generic, TypeVar

from astream._dataset.depth import queue_depth
from astream._storage.loop import LoopThread
from astream.errors import UsageError

__all__ = ["SyncIterator"]

T = TypeVar("T")
_END = object()


class SyncIterator(Generic[T]):
    """Iterate an async iterator from synchronous code, through a bounded queue.

    Args:
        portal: the loop thread the async iterator runs on.
        open_iterator: returns an async context manager that yields the async iterator;
            it is entered on the loop thread, so every resource it creates belongs there.
        maxsize: how many items may wait in the queue (prefetch depth; at least: small
            items queue deeper, see :mod:`astream._dataset.depth`).
    """

    def __init__(
        self,
        portal: LoopThread,
        open_iterator: Callable[[], AbstractAsyncContextManager[AsyncIterator[T]]],
        maxsize: int = 2,
    ) -> None:
        self._portal = portal
        self._queue: queue.Queue[tuple[object, Any]] = queue.Queue()
        self._done = False
        self._slots: asyncio.Semaphore | None = None
        self._task: asyncio.Task[None] | None = None
        self._maxsize = max(1, maxsize)
        self._sized = False
        # Set while the consumer is blocked on an empty queue; ``_taken`` once it has its item.
        self._waiting = False
        self._taken = threading.Event()
        # Not waited for here: the pump starts on the loop thread while the caller goes on.
        self._closed = False
        portal.submit(self._start(open_iterator, self._maxsize))

    async def _start(
        self, open_iterator: Callable[[], AbstractAsyncContextManager[AsyncIterator[T]]], maxsize: int
    ) -> None:
        self._slots = asyncio.Semaphore(maxsize)
        self._task = asyncio.get_running_loop().create_task(self._pump(open_iterator))

    async def _pump(self, open_iterator: Callable[[], AbstractAsyncContextManager[AsyncIterator[T]]]) -> None:
        assert self._slots is not None
        put = self._queue.put_nowait
        first = True
        try:
            async with open_iterator() as iterator:
                async for item in iterator:
                    await self._slots.acquire()
                    put(("item", item))
                    if first and self._waiting:
                        # Hand the GIL over with the first item. Otherwise this thread goes
                        # on reading the next batches while the woken consumer waits for
                        # the GIL (up to the 5 ms switch interval; the first batch of a warm
                        # 100 KB-sample loader ~15 -> ~10 ms). Only the first: doing it for
                        # every item serialises producer and consumer (1 KB samples through
                        # Loader: 650k -> 370k samples/s). Bounded: at most 2 ms.
                        self._taken.wait(0.002)
                    first = False
            put((_END, None))
        except asyncio.CancelledError:
            put((_END, None))
            raise
        except BaseException as exc:  # handed to the consumer, which re-raises it
            put(("error", exc))

    def __iter__(self) -> Iterator[T]:
        return self

    def __next__(self) -> T:
        if self._done:
            raise StopIteration
        try:
            kind, value = self._queue.get_nowait()
        except queue.Empty:
            self._taken.clear()
            self._waiting = True
            try:
                kind, value = self._queue.get()
            finally:
                self._waiting = False
                self._taken.set()
        if kind == "item":
            assert self._slots is not None
            if not self._sized:
                # Small items: let the queue grow deeper (depth.py).
                self._sized = True
                extra = queue_depth(self._maxsize, value) - self._maxsize
                if extra > 0:
                    # One wake-up of the loop for all of them, not one per slot.
                    self._portal.loop.call_soon_threadsafe(_release, self._slots, extra)
            self._portal.loop.call_soon_threadsafe(self._slots.release)
            return value  # type: ignore[no-any-return]
        self._done = True
        if kind == "error":
            raise value
        raise StopIteration

    def close(self) -> None:
        """Cancel the pump (and with it the async iterator and its transfers); idempotent."""
        if self._closed:
            return
        self._closed = self._done = True
        # Wakes a thread blocked in __next__ even if the pump never gets to run (cancelled
        # before its first step, or its loop already stopped).
        self._queue.put_nowait((_END, None))

        async def cancel() -> None:
            # On the loop, after the pump's start (the loop runs what was submitted in order).
            task, self._task = self._task, None
            if task is None:
                return
            task.cancel()
            with contextlib.suppress(BaseException):
                await task

        with contextlib.suppress(UsageError):
            self._portal.call(cancel())

    def __enter__(self) -> SyncIterator[T]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _release(slots: asyncio.Semaphore, count: int) -> None:
    for _ in range(count):
        slots.release()
