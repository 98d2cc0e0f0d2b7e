"""The node agent's shard desk: one download per shard per node, pins, prefetches.

Split from :mod:`astream._coord.agent` because deduplicating fetches is one job with its
own books (the fetches in flight, their waiters, the prefetches that want each, the
node-wide pin counts) and one rule that ties them: a fetch runs while someone waits for,
prefetches or pins its shard, and is cancelled once nobody does. The agent's request
handling, barriers and epoch only call into it.
"""

from __future__ import annotations

import asyncio
import logging
import time
from collections import Counter
from typing import Any

from astream._coord.connection import Conn, Wait
from astream._coord.provider import Hurried, Rechecked, ShardProvider

__all__ = ["ShardDesk"]

log = logging.getLogger("astream.coord")


class ShardDesk:
    """The shard requests of :class:`~astream._coord.agent.Agent` (mixed in).

    The agent's constructor sets every attribute declared here.
    """

    provider: ShardProvider
    stats: Counter[str]
    _hurried: Hurried | None
    _rechecked: Rechecked | None
    _pins: Counter[str]
    _inflight: dict[str, asyncio.Task[str]]
    _prefetched: dict[str, set[int]]  # key -> the connections whose prefetch wants it
    _closing: bool
    _waiters: dict[str, list[Wait]]
    _stage: dict[str, tuple[str, float]]

    def _pin(self, conn: Conn, key: str, delta: int) -> None:
        if (key in conn.pins) == (delta > 0):
            return  # pins are a set per connection: repeats change nothing
        if delta > 0:
            # A key enters the books only once the provider knows it (lookup raises for one
            # that names no shard): an unknown pin would fail again at the connection's end.
            self.provider.lookup(key)
            conn.pins.add(key)
        else:
            conn.pins.discard(key)
        self._add_pins(key, delta)

    def _add_pins(self, key: str, delta: int) -> None:
        self._pins[key] += delta
        count = self._pins[key]
        if count <= 0:
            del self._pins[key]
            count = 0
        self.provider.on_pins_changed(key, count)

    def _ensure(self, conn: Conn, keys: list[str], request: int, *, pin: bool, single: bool,
                first: bool = False) -> None:
        wait = Wait(conn, request, keys, single)
        for key in keys:
            if pin:
                self._pin(conn, key, 1)
            path = self.provider.lookup(key)
            if path is not None:
                self.stats["hits"] += 1
                wait.deliver(key, path, None)
                continue
            if first:
                self._hurry(key)
            self._waiters.setdefault(key, []).append(wait)
            if key in self._inflight:
                self.stats["coalesced"] += 1
                continue
            self._start_fetch(key)

    def _missing(self, conn: Conn, key: str, request: int) -> None:
        """A client found ``key``'s file gone after it was given its path (a cleaner of the
        temporary folder, a user): the provider looks at the disk again and forgets it if so,
        and the client is answered as an ``ensure`` (a fetch, or the path if it is there)."""
        self.stats["missing"] += 1
        if key not in self._inflight and self._rechecked is not None and self._rechecked.recheck(key):
            self.stats["refetched"] += 1
            log.warning("astream agent: shard %r vanished from the cache (pid %d saw it); fetching it again",
                        key, conn.pid)
        self._ensure(conn, [key], request, pin=False, single=True)

    def _prefetch(self, conn: Conn, keys: list[str], *, first: bool = False) -> None:
        for key in keys:
            if self.provider.lookup(key) is not None:
                continue
            if first:
                self._hurry(key)
            self._prefetched.setdefault(key, set()).add(conn.number)
            if key not in self._inflight:
                self.stats["prefetches"] += 1
                self._start_fetch(key)

    def _withdraw(self, conn: Conn, keys: list[str]) -> None:
        """``conn`` no longer wants its prefetches of ``keys`` (it asked, or it left): a fetch
        that no other prefetch wants, nobody waits for and nobody pins is cancelled, so its
        transfer stops and leaves the link to what is needed (a dataset told to resume
        elsewhere, or closed, before it read anything)."""
        for key in keys:
            wanted = self._prefetched.get(key)
            if wanted is None:
                continue
            wanted.discard(conn.number)
            if wanted:
                continue
            del self._prefetched[key]
            task = self._inflight.get(key)
            if task is not None and not self._waiters.get(key) and not self._pins.get(key):
                self.stats["withdrawn"] += 1
                task.cancel()

    def _hurry(self, key: str) -> None:
        """Every reader's first batch before any reader's later shards: a node whose ranks
        (and workers) ask one after the other still starts each of them at once."""
        if self._hurried is not None:
            self.stats["first_requests"] += 1
            self._hurried.hurry(key)

    def _start_fetch(self, key: str) -> None:
        self.stats["fetches"] += 1
        self._stage[key] = ("queue", time.monotonic())
        task = asyncio.get_running_loop().create_task(self._fetch(key))
        self._inflight[key] = task
        task.add_done_callback(lambda t, key=key: self._fetched(key, t))  # type: ignore[misc]

    async def _fetch(self, key: str) -> str:
        def stage(name: str) -> None:
            self._stage[key] = (name, time.monotonic())

        return await self.provider.ensure(key, stage)

    def _fetched(self, key: str, task: asyncio.Task[str]) -> None:
        self._inflight.pop(key, None)
        self._stage.pop(key, None)
        if task.cancelled():
            # Withdrawn (or the agent is shutting down). Whoever asked for the key while the
            # cancelled fetch wound up gets a fetch of its own (one at a time per key).
            if not self._closing and (self._waiters.get(key) or self._prefetched.get(key)):
                self._start_fetch(key)
            else:
                self._waiters.pop(key, None)
                self._prefetched.pop(key, None)
            return
        self._prefetched.pop(key, None)
        waiters = self._waiters.pop(key, [])
        exc = task.exception()
        if exc is not None:
            self.stats["fetch_errors"] += 1
            # Nobody waiting: a prefetch (whoever asks for it later meets the error again,
            # with its own request); a warning would only be noise, e.g. for a cache folder
            # removed right after its dataset closed while a prefetch was still running.
            log.log(logging.WARNING if waiters else logging.DEBUG,
                    "astream agent: shard %r failed for %d waiter(s): %s", key, len(waiters), exc)
        for wait in waiters:
            wait.deliver(key, None if exc else task.result(), exc)

    # -- introspection ------------------------------------------------------------------

    def inspect_shard(self, key: str) -> dict[str, Any]:
        """What the node is doing about ``key``: stage, for how long, who waits."""
        stage, since = self._stage.get(key, ("ready" if self.provider.lookup(key) else "idle", time.monotonic()))
        waiters = sorted({w.conn.member for w in self._waiters.get(key, [])})
        return {"stage": stage, "stage_seconds": round(time.monotonic() - since, 3), "waiters": waiters,
                "pins": self._pins.get(key, 0)}
