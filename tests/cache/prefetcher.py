"""A plan-order prefetcher straight over a :class:`ShardEngine`, for the cache layer's tests.

It was ``astream._cache.prefetch``; the package keeps one live prefetch path (the epoch
reader's leases through the node agent, and the node's plan-aware prefetch in
``astream._node.provider``), and this driver of the engine lives where it is used.

::

    async with Prefetcher(engine, plan=[3, 0, 7, ...], predownload=4096) as shards:
        async for lease in shards:        # in plan order, each as soon as it is ready
            with lease:                   # the shard stays pinned inside the block
                read(lease.path)

A driver task reserves plan positions in order (so an earlier shard always gets cache
room before a later one), keeping up to ``predownload`` samples' worth ahead of the
consumer; the engine runs the transfers (bounded, throttle-aware). The prefetcher is
a bounded channel behind ``async with``, not an async generator that owns tasks:
leaving the block cancels every transfer it started and leaves no temporaries, even
when the block is left by a cancellation.
"""

from __future__ import annotations

import asyncio
import time
import warnings
from collections.abc import Callable, Sequence
from types import TracebackType

from astream._cache.engine import ShardEngine
from astream.errors import ConfigError, UsageError

__all__ = ["Prefetcher", "ShardLease"]


class ShardLease:
    """One plan position handed to the consumer: the shard is pinned until :meth:`release`."""

    def __init__(self, engine: ShardEngine, shard: int, position: int, path: str) -> None:
        self.shard = shard
        self.position = position
        self.path = path
        self._engine: ShardEngine | None = engine

    def release(self) -> None:
        """Unpin the shard (idempotent); it may be evicted afterwards."""
        engine, self._engine = self._engine, None
        if engine is not None:
            engine.unpin(self.shard)

    def __enter__(self) -> ShardLease:
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.release()

    def __repr__(self) -> str:
        return f"ShardLease(shard={self.shard}, position={self.position}, path={self.path!r})"


class Prefetcher:
    """Hands out the shards of ``plan`` in order, downloading ahead of the consumer.

    Args:
        engine: a started :class:`ShardEngine`.
        plan: shard indices in the order the consumer reads them (repeats allowed).
        predownload: samples to keep ready or downloading ahead of the consumer; the next
            shard is always fetched. None: ``2 * max_concurrency`` shards ahead.
        samples: samples the consumer reads at each plan position (default: the whole shard).
    """

    def __init__(
        self,
        engine: ShardEngine,
        plan: Sequence[int],
        *,
        predownload: int | None = None,
        samples: Sequence[int] | None = None,
    ) -> None:
        n = len(engine.index.shards)
        if any(not 0 <= s < n for s in plan):
            raise ConfigError(f"the shard plan names a shard outside 0..{n - 1}")
        if predownload is not None and (isinstance(predownload, bool) or predownload < 0):
            raise ConfigError(f"predownload must be a non-negative number of samples, got {predownload!r}")
        if samples is not None and len(samples) != len(plan):
            raise ConfigError(f"samples has {len(samples)} entries for a plan of {len(plan)} positions")
        self.engine = engine
        self.plan = list(plan)
        self.predownload = predownload
        self._samples = list(samples) if samples is not None else [engine.index.shards[s].samples for s in plan]
        self._max_ahead = max(1, 2 * engine._aimd.maximum) if predownload is None else len(self.plan)
        self._next = 0  # the position the consumer asks for next
        self._admitted = 0  # positions reserved so far
        self._reserved: dict[int, int] = {}  # position -> shard, pinned, not yet handed out
        self._waiting_for: int | None = None
        self._driver: asyncio.Task[None] | None = None
        self._progress = asyncio.Event()  # the driver admitted a position, or finished
        self._moved = asyncio.Event()  # the consumer advanced
        self._closed = False

    def _may_admit(self, pos: int) -> bool:
        if pos <= self._next:
            return True
        if pos - self._next >= self._max_ahead:
            return False
        if self.predownload is None:
            return True
        return sum(self._samples[self._next : pos + 1]) <= self.predownload

    def _stuck_at(self, pos: int) -> Callable[[], bool]:
        return lambda: self._waiting_for == pos

    async def _drive(self) -> None:
        try:
            for pos, shard in enumerate(self.plan):
                while not self._may_admit(pos):
                    self._moved.clear()
                    await self._moved.wait()
                await self.engine.reserve(shard, stuck=self._stuck_at(pos))
                self._reserved[pos] = shard
                self._admitted = pos + 1
                self._progress.set()
        finally:
            self._progress.set()

    async def __aenter__(self) -> Prefetcher:
        if self._driver is not None or self._closed:
            raise UsageError("a Prefetcher is entered once")
        await self.engine.start()
        self._driver = asyncio.get_running_loop().create_task(self._drive())
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()

    def __aiter__(self) -> Prefetcher:
        return self

    async def __anext__(self) -> ShardLease:
        if self._driver is None or self._closed:
            raise UsageError("iterate a Prefetcher inside `async with`")
        pos = self._next
        if pos >= len(self.plan):
            raise StopAsyncIteration
        started = time.perf_counter()
        self._waiting_for = pos
        self.engine._wake()  # a reservation waiting for room re-checks whether it is stuck
        try:
            while pos >= self._admitted:
                if self._driver.done():
                    self._driver.result()  # raises the driver's error
                    raise UsageError("the prefetch driver ended early")  # pragma: no cover
                self._progress.clear()
                await self._progress.wait()
            shard = self._reserved.pop(pos)
            try:
                path = await self.engine.wait_ready(shard)
            except BaseException:
                self._reserved[pos] = shard
                raise
        finally:
            self._waiting_for = None
            self.engine.stats.consumer_wait_s += time.perf_counter() - started
        self._next = pos + 1
        self._moved.set()
        return ShardLease(self.engine, shard, pos, path)

    def __del__(self) -> None:
        if getattr(self, "_driver", None) is not None and not getattr(self, "_closed", True):
            warnings.warn(
                "Prefetcher was not closed; use `async with Prefetcher(...)` (its shards stay pinned)",
                ResourceWarning,
                stacklevel=2,
            )

    async def aclose(self) -> None:
        """Cancel the driver and every transfer nobody received; idempotent and cancellation-safe."""
        if self._closed:
            return
        self._closed = True
        interrupted: BaseException | None = None
        driver = self._driver
        if driver is not None:
            driver.cancel()
            try:
                await asyncio.shield(asyncio.gather(driver, return_exceptions=True))
            except asyncio.CancelledError as exc:  # finish cleaning up, then re-raise
                interrupted = exc
        shards = list(self._reserved.values())
        self._reserved.clear()
        for shard in shards:
            self.engine.unpin(shard)
        try:
            await self.engine.settle(shards)
        except asyncio.CancelledError as exc:
            interrupted = interrupted or exc
        if interrupted is not None:
            raise interrupted
