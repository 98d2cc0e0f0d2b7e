"""astream's own event loops: on uvloop when it is installed, never via the global policy.

:func:`new_event_loop` makes a loop (uvloop's if available); :func:`run` runs a
coroutine to completion on such a loop (``asyncio.Runner(loop_factory=...)`` on 3.11+,
the equivalent by hand on 3.10). :class:`LoopThread` keeps one running in a private
daemon thread for synchronous callers (the writer's background uploads, the sync
iterator). The user's ``asyncio`` policy is never read or changed.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import sys
import threading
import warnings
from collections.abc import Awaitable, Coroutine
from types import TracebackType
from typing import Any, TypeVar

from astream.errors import UsageError

__all__ = ["LoopThread", "new_event_loop", "run", "uvloop_available", "within"]

# Seconds close() waits for the loop's tasks to finish, then for its thread.
_CLOSE_TIMEOUT = 30.0

T = TypeVar("T")


def uvloop_available() -> bool:
    """Whether uvloop can be imported here."""
    try:
        import uvloop  # noqa: F401
    except ImportError:
        return False
    return True


def new_event_loop(use_uvloop: bool | None = None) -> asyncio.AbstractEventLoop:
    """A new event loop: uvloop's when installed (or when ``use_uvloop`` is True), else asyncio's.

    Raises:
        UsageError: ``use_uvloop=True`` but uvloop is not installed.
    """
    if use_uvloop is not False:
        try:
            import uvloop
        except ImportError:
            if use_uvloop:
                raise UsageError("use_uvloop=True but uvloop is not installed (`pip install uvloop`)") from None
        else:
            loop: asyncio.AbstractEventLoop = uvloop.new_event_loop()
            return loop
    return asyncio.new_event_loop()


def run(main: Coroutine[Any, Any, T], *, use_uvloop: bool | None = None) -> T:
    """Run ``main`` on a fresh astream loop and close the loop afterwards."""
    if sys.version_info >= (3, 11):
        with asyncio.Runner(loop_factory=lambda: new_event_loop(use_uvloop)) as runner:
            return runner.run(main)
    loop = new_event_loop(use_uvloop)  # pragma: no cover - Python 3.10
    try:  # pragma: no cover
        return loop.run_until_complete(main)
    finally:  # pragma: no cover
        with contextlib.suppress(Exception):
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.run_until_complete(loop.shutdown_default_executor())
        loop.close()


class LoopThread:
    """An event loop running in a private daemon thread; submit coroutines from sync code.

    Use as a context manager; ``close()`` is idempotent and a forgotten one warns.
    """

    def __init__(self, name: str = "astream-loop", *, use_uvloop: bool | None = None) -> None:
        self._loop = new_event_loop(use_uvloop)
        self._thread = threading.Thread(target=self._main, name=name, daemon=True)
        self._closed = False
        self._thread.start()

    def _main(self) -> None:
        asyncio.set_event_loop(self._loop)
        self._loop.run_forever()
        with contextlib.suppress(Exception):
            self._loop.run_until_complete(self._loop.shutdown_asyncgens())
            self._loop.run_until_complete(self._loop.shutdown_default_executor())
        self._loop.close()

    @property
    def loop(self) -> asyncio.AbstractEventLoop:
        return self._loop

    def submit(self, coro: Coroutine[Any, Any, T]) -> concurrent.futures.Future[T]:
        """Schedule ``coro`` on the thread's loop; returns a concurrent future."""
        if self._closed:
            coro.close()
            raise UsageError("this LoopThread is closed")
        return asyncio.run_coroutine_threadsafe(coro, self._loop)

    def call(self, coro: Coroutine[Any, Any, T], timeout: float | None = None) -> T:
        """Run ``coro`` on the thread's loop and wait for its result.

        Raises:
            UsageError: called from the loop's own thread (it would wait for itself forever).
        """
        if threading.current_thread() is self._thread:
            coro.close()
            raise UsageError(
                "a synchronous astream call was made from inside astream's own event loop; "
                "use the async form (await ds.aget(i), async for ...) there"
            )
        return self.submit(coro).result(timeout)

    def close(self) -> None:
        """Stop the loop (tasks still running are cancelled) and join the thread."""
        if self._closed:
            return
        self._closed = True

        async def _cancel_all() -> None:
            # Again until none is left: cleanup code that runs on cancellation may start
            # tasks of its own, and async generators still running when the loop stops
            # cannot be finalized ("athrow(): asynchronous generator is already running").
            loop = asyncio.get_running_loop()
            deadline = loop.time() + _CLOSE_TIMEOUT
            while loop.time() < deadline:
                tasks = [t for t in asyncio.all_tasks() if t is not asyncio.current_task()]
                if not tasks:
                    return
                for task in tasks:
                    task.cancel()
                await asyncio.wait(tasks, timeout=deadline - loop.time())

        if self._thread.is_alive():
            with contextlib.suppress(Exception):
                asyncio.run_coroutine_threadsafe(_cancel_all(), self._loop).result(_CLOSE_TIMEOUT + 5)
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(self._loop.stop)
            # Bounded: a close (at interpreter exit, say) never hangs on a stuck thread.
            self._thread.join(_CLOSE_TIMEOUT)

    def __enter__(self) -> LoopThread:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.close()

    def __del__(self) -> None:
        if not getattr(self, "_closed", True):
            warnings.warn("LoopThread was not closed; use it as a context manager", ResourceWarning, stacklevel=2)


if sys.version_info >= (3, 11):
    async def within(seconds: float, aw: Awaitable[T]) -> T:
        """``await aw`` for at most ``seconds`` (``TimeoutError`` past them).

        Not ``asyncio.wait_for``: on Python 3.11 it loses a cancellation that arrives as
        the awaited thing completes (gh-86296), and the cancelled task then runs on as if
        never cancelled; ``asyncio.timeout`` does not.
        """
        async with asyncio.timeout(seconds):
            return await aw
else:  # pragma: no cover - Python 3.10
    async def within(seconds: float, aw: Awaitable[T]) -> T:
        return await asyncio.wait_for(aw, seconds)
