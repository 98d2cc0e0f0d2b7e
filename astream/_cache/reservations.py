"""How a shard gets its room in the cache: the reservations of :class:`ShardEngine`.

Split from :mod:`astream._cache.engine` because granting room is one job with its own
rules, apart from moving bytes (:mod:`.installer`) and the engine's lifecycle: a
reservation pins its shard and waits for room in the order it was asked (so a
prefetcher that reserves in plan order never lets a later shard take an earlier one's
room); a prefetch only takes room that can be made now; and the transfers a reader's
first batch needs get the slots before every other transfer.
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
from collections.abc import Callable

from astream._cache.cache import State
from astream._cache.installer import Installation
from astream.errors import CacheError, UsageError

__all__ = ["Reservations"]

# Added to the priority of work nobody needs for a first batch: the shards the node's
# readers read first (each rank's, each worker's) take the transfer slots before any
# reader's later shards, whichever order their requests came in.
_LATER = 1 << 48


class Reservations(Installation):
    """The reservations of :class:`~astream._cache.engine.ShardEngine` (mixed in; it sets these)."""

    _order: itertools.count[int]  # reservation order = priority of the file work
    _priorities: dict[int, int]  # of the installs running or waiting
    _tasks: dict[int, asyncio.Task[None]]
    _cancelled: dict[int, asyncio.Task[None]]
    _change: asyncio.Event | None
    _started: bool
    _closed: bool

    async def _wait_change(self, timeout: float | None = None) -> None:
        assert self._change is not None
        self._change.clear()
        if timeout is None:
            await self._change.wait()
        else:
            with contextlib.suppress(asyncio.TimeoutError):
                await asyncio.wait_for(self._change.wait(), timeout)

    def _running(self) -> bool:
        return any(not t.done() for t in self._tasks.values())

    async def reserve(
        self, i: int, *, stuck: Callable[[], bool] | None = None, next_use: Callable[[int], float] | None = None,
        make_way: Callable[[], bool] | None = None, urgent: bool = False,
    ) -> None:
        """Pin shard ``i`` and make sure it is ready or being installed.

        Waits while the cache is full of pinned shards. Reservations are granted in the
        order they are asked for, so a prefetcher that reserves in plan order can never
        let a later shard take the room an earlier one needs.

        Args:
            i: the shard index.
            stuck: called while waiting for room; if it returns True and nothing is in
                flight, waiting could only end by a consumer releasing a pin it will
                not release: raise instead of deadlocking.
            next_use: the node plan's distance to each shard's next read: evict the
                farthest first (None: least recently used first).
            make_way: called when there is no room; returns True if it cancelled
                something (a prefetch) whose bytes will come free.
            urgent: a reader's first batch needs it: its transfer goes before every
                transfer that is not urgent (see :meth:`hurry`).

        Raises:
            CacheError: no room can be made (see ``stuck``).
        """
        if not self._started or self._closed:
            raise UsageError("use the ShardEngine inside `async with` (it is not started or is closed)")
        entry = self.cache.entries[i]
        need = self.cache.footprint(i)
        # A transfer cancelled (its last pin went) but not yet wound up cannot be joined:
        # wait until it has released its bytes, then start afresh.
        while (task := self._cancelling(i)) is not None:
            await asyncio.wait([task])
        while entry.state is State.ABSENT:
            if self._start_install(i, next_use, None, urgent):
                break
            if make_way is not None and make_way():
                await self._wait_change()
                continue
            if stuck is not None and stuck() and not self._running():
                raise CacheError(
                    f"cache_limit={self.cache.limit} bytes is full of shards in use (pinned: "
                    f"{self.cache.pinned}) and shard {i} needs {need} more bytes; release shards "
                    "you are done with, or raise cache_limit"
                )
            # With a stuck check, look again now and then: it may be a matter of time.
            await self._wait_change(None if stuck is None else 0.5)
        else:
            if entry.needs_check(bool(self.validate_hash)):
                entry.begin_check()
                self._tasks[i] = asyncio.get_running_loop().create_task(
                    self._install(i, verify=True, priority=next(self._order))
                )
            else:
                self.stats.hits += 1  # ready, or joining a transfer already running
                if urgent:
                    self.hurry(i)
        self.cache.pin(i)
        self._wake()

    def _cancelling(self, i: int) -> asyncio.Task[None] | None:
        """The transfer of shard ``i`` if it was cancelled and is still winding up."""
        task = self._cancelled.get(i)
        if task is None or task.done() or self._tasks.get(i) is not task:
            self._cancelled.pop(i, None)
            return None
        return task

    def _start_install(
        self, i: int, next_use: Callable[[int], float] | None, soon: Callable[[int], bool] | None,
        urgent: bool = False,
    ) -> bool:
        """Make room for absent shard ``i`` and start installing it; False if no room."""
        victims = self.cache.make_room(self.cache.footprint(i), next_use, soon)
        if victims is None:
            return False
        self.stats.evictions += len(victims)
        self.cache.begin(i)
        self.stats.misses += 1
        priority = next(self._order) + (0 if urgent else _LATER)
        self._priorities[i] = priority
        task = asyncio.get_running_loop().create_task(self._install(i, verify=False, priority=priority))
        self._tasks[i] = task

        def settled(task: asyncio.Task[None]) -> None:
            if self._priorities.get(i) == priority:
                del self._priorities[i]
            self._slots.forget(priority)
            # Cancelled before it ever ran (its last pin went at once), the install's own
            # clean-up never started: release the bytes reserved for it here.
            if task.cancelled() and self._tasks.get(i) is task and self.cache.entries[i].state is State.BUSY:
                self.cache.forget(i)
                self._wake()

        task.add_done_callback(settled)
        return True

    def hurry(self, i: int) -> None:
        """A reader's first batch needs shard ``i``: if its transfer waits for a slot (or has
        yet to ask for one) behind work that is not urgent, it goes first."""
        priority = self._priorities.get(i)
        if priority is not None and priority >= _LATER:
            self._slots.hurry(priority, priority - _LATER)

    def try_reserve(self, i: int, next_use: Callable[[int], float], soon: Callable[[int], bool]) -> bool:
        """Pin shard ``i`` and start installing it if room can be made now, never waiting.

        For a prefetch: ``next_use`` ranks the residents as they will stand when ``i`` is
        read, and the ``soon`` ones (read before ``i``) may not go. Returns False (nothing
        pinned) where there is no such room.
        """
        if not self._started or self._closed:
            raise UsageError("use the ShardEngine inside `async with` (it is not started or is closed)")
        entry = self.cache.entries[i]
        if self._cancelling(i) is not None:
            return False
        if entry.state is State.ABSENT:
            if not self._start_install(i, next_use, soon):
                return False
            self.stats.prefetches += 1
        self.cache.pin(i)
        self._wake()
        return True
