"""An async iterator that owns an async context manager, for ``async for x in obj``.

``async for`` has no ``async with``; this object enters the context (which owns
prefetch tasks) on the first ``__anext__`` and exits it when the iteration ends,
fails, or is closed with :meth:`aclose`. An iterator abandoned mid-way (``break``)
closes itself when it is garbage collected, on the loop it ran on.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager
from typing import Generic, TypeVar

__all__ = ["ManagedAsyncIterator"]

T = TypeVar("T")


class ManagedAsyncIterator(Generic[T]):
    """Iterate what ``context`` yields; close ``context`` when done."""

    def __init__(self, context: AbstractAsyncContextManager[AsyncIterator[T]]) -> None:
        self._context: AbstractAsyncContextManager[AsyncIterator[T]] | None = context
        self._iterator: AsyncIterator[T] | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._entered = False

    def __aiter__(self) -> ManagedAsyncIterator[T]:
        return self

    async def __anext__(self) -> T:
        if self._context is None:
            raise StopAsyncIteration
        if not self._entered:
            self._loop = asyncio.get_running_loop()
            self._iterator = await self._context.__aenter__()
            self._entered = True
        assert self._iterator is not None
        try:
            return await self._iterator.__anext__()
        except StopAsyncIteration:
            await self.aclose()
            raise
        except BaseException as exc:
            await self._exit(exc)
            raise

    async def _exit(self, exc: BaseException | None) -> None:
        context, self._context = self._context, None
        iterator, self._iterator = self._iterator, None
        if context is None or not self._entered:
            return
        if iterator is not None and hasattr(iterator, "aclose"):
            with contextlib.suppress(Exception):
                await iterator.aclose()
        if exc is None:
            await context.__aexit__(None, None, None)
        else:
            await context.__aexit__(type(exc), exc, exc.__traceback__)

    async def aclose(self) -> None:
        """Stop early and release everything (idempotent)."""
        await asyncio.shield(self._exit(None))

    @property
    def loop(self) -> asyncio.AbstractEventLoop | None:
        """The loop this iteration runs on (None before its first item)."""
        return self._loop

    def close_soon(self) -> None:
        """Close from any thread, without waiting: scheduled on the iteration's own loop."""
        if not self._entered:
            self._context = None  # never started, and now it never will
            return
        loop = self._loop
        if self._context is None or loop is None or loop.is_closed():
            return
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        with contextlib.suppress(RuntimeError):
            if running is loop:
                # On the loop's own thread (an ``async for`` left with ``break``): one task,
                # created at once, so a loop shutting down (asyncio.run) waits for it before
                # it finalizes async generators instead of racing it (a shield would add a
                # second task that the shutdown does not know about).
                loop.create_task(self._exit(None))
            else:
                loop.call_soon_threadsafe(lambda: loop.create_task(self.aclose()))

    async def __aenter__(self) -> ManagedAsyncIterator[T]:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def __del__(self) -> None:
        if self._context is not None and self._entered:
            self.close_soon()
