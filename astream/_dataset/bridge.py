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
import weakref
from collections.abc import AsyncIterator, Callable, Coroutine, Iterator
from concurrent.futures import Future
from contextlib import AbstractAsyncContextManager
from typing import Any, Generic, TypeVar

from astream.errors import UsageError

__all__ = ["LoopThread", "SyncIterator"]

T = TypeVar("T")
_END = object()


class LoopThread:
    """One event loop running forever in a daemon thread.

    Args:
        loop_factory: makes the loop (uvloop's when installed); the global policy of the
            program is never touched.
        name: the thread's name, shown in tracebacks and py-spy.
    """

    def __init__(self, loop_factory: Callable[[], asyncio.AbstractEventLoop], name: str = "astream-loop") -> None:
        self._loop = loop_factory()
        self._ready = threading.Event()
        self._closed = False
        # The thread must not reference self, or a forgotten LoopThread could never be collected.
        self._thread = threading.Thread(target=_run_loop, args=(self._loop, self._ready), name=name, daemon=True)
        self._thread.start()
        self._ready.wait()
        # A LoopThread dropped without close() must not keep a thread alive for nothing.
        self._finalizer = weakref.finalize(self, _stop_loop, self._loop, self._thread)

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        return self._loop

    def submit(self, coro: Coroutine[Any, Any, T]) -> Future[T]:
        """Schedule ``coro`` on the loop; returns a concurrent future."""
        if self._closed:
            coro.close()
            raise UsageError("this astream loop thread is closed; create a new iterator")
        return asyncio.run_coroutine_threadsafe(coro, self._loop)

    def call(self, coro: Coroutine[Any, Any, T]) -> T:
        """Run ``coro`` on the loop and wait for its result (from any other thread)."""
        if threading.current_thread() is self._thread:
            coro.close()
            raise UsageError("a sync astream call was made from inside astream's own event loop")
        return self.submit(coro).result()

    def close(self) -> None:
        """Stop the loop and join the thread; idempotent."""
        if self._closed:
            return
        self._closed = True
        self._finalizer()


def _run_loop(loop: asyncio.AbstractEventLoop, ready: threading.Event) -> None:
    asyncio.set_event_loop(loop)
    loop.call_soon(ready.set)
    try:
        loop.run_forever()
    finally:
        with contextlib.suppress(Exception):
            loop.run_until_complete(loop.shutdown_asyncgens())
        loop.close()


def _stop_loop(loop: asyncio.AbstractEventLoop, thread: threading.Thread) -> None:
    if not loop.is_closed():
        loop.call_soon_threadsafe(loop.stop)
    if thread is not threading.current_thread():
        thread.join(timeout=10)


class SyncIterator(Generic[T]):
    """Iterate an async iterator from synchronous code, through a bounded queue.

    Args:
        portal: the loop thread the async iterator runs on.
        open_iterator: returns an async context manager that yields the async iterator;
            it is entered on the loop thread, so every resource it creates belongs there.
        maxsize: how many items may wait in the queue (prefetch depth).
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
        self._started = threading.Event()
        portal.submit(self._start(open_iterator, max(1, maxsize))).result()

    async def _start(
        self, open_iterator: Callable[[], AbstractAsyncContextManager[AsyncIterator[T]]], maxsize: int
    ) -> None:
        self._slots = asyncio.Semaphore(maxsize)
        self._task = asyncio.get_running_loop().create_task(self._pump(open_iterator))

    async def _pump(self, open_iterator: Callable[[], AbstractAsyncContextManager[AsyncIterator[T]]]) -> None:
        assert self._slots is not None
        put = self._queue.put_nowait
        try:
            async with open_iterator() as iterator:
                async for item in iterator:
                    await self._slots.acquire()
                    put(("item", item))
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
        kind, value = self._queue.get()
        if kind == "item":
            assert self._slots is not None
            self._portal.loop.call_soon_threadsafe(self._slots.release)
            return value  # type: ignore[no-any-return]
        self._done = True
        if kind == "error":
            raise value
        raise StopIteration

    def close(self) -> None:
        """Cancel the pump (and with it the async iterator and its transfers); idempotent."""
        task, self._task = self._task, None
        self._done = True
        if task is None:
            return

        async def cancel() -> None:
            task.cancel()
            with contextlib.suppress(BaseException):
                await task

        with contextlib.suppress(UsageError):
            self._portal.call(cancel())

    def __enter__(self) -> SyncIterator[T]:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
