"""A rank's or worker's connection to its node agent: :class:`AsyncNodeClient`.

Joining is connecting: the client derives the node's agent address from the local cache
folder and run id, connects, and if nobody listens it binds the address itself and starts
the agent (it is then the leader). When the agent dies, every client notices its socket
close and at once elects a new agent the same way (so the new agent learns its pins and its
last known epoch before anyone asks it to evict), and calls in flight are retried — or
fail with ``CoordinationError`` once ``CoordConfig.connect_timeout`` has passed.

Example::

    async with AsyncNodeClient(local="/tmp/cache", provider=factory, world=world) as node:
        epoch = await node.begin_epoch()
        async with node.pinned("shard.00000.mds") as path:
            ...
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import warnings
from collections import Counter
from collections.abc import AsyncIterator, Sequence
from typing import Any

from astream._coord.config import CoordConfig
from astream._coord.joining import Joining
from astream._coord.link import AgentLost, Link
from astream._coord.provider import ProviderFactory
from astream._coord.rendezvous import Address, default_run_id, derive_address
from astream._coord.watchdog import WatchPolicy, describe_barrier, describe_shard, watched
from astream._coord.wire import MAX_KEYS
from astream._coord.world import World
from astream._resource import AsyncResource
from astream._storage.loop import within
from astream.errors import BarrierTimeout, CoordinationError

__all__ = ["AsyncNodeClient"]

_MAX_REELECTIONS = 5


class AsyncNodeClient(Joining, AsyncResource):
    """A process's membership of its node: ensure, pins, barriers, epoch.

    Joining and re-electing the agent are :class:`~astream._coord.joining.Joining`'s; the
    reader reports, :class:`~astream._coord.reports.PlanReports`'.

    Args:
        local: the node's local cache folder (with ``run_id``, it names the node's agent).
        provider: picklable factory of the :class:`~.provider.ShardProvider`, used if this
            process has to start the agent.
        run_id: separates two jobs on one machine; default from the launcher's environment
            (:func:`~.rendezvous.default_run_id`).
        world: this process's place; default :meth:`World.from_env`.
        member: its name at barriers; default ``world.member`` (``"rank3.worker1"``).
        config: timeouts and limits.
        view: the identity of the dataset this client reads (its indexes, splits, columns):
            part of the agent's address, and checked by the agent at hello, so two datasets
            on one ``local`` never share an agent (each would read the other's shards).
    """

    def __init__(self, local: str, provider: ProviderFactory, *, run_id: str | None = None,
                 world: World | None = None, member: str | None = None, config: CoordConfig | None = None,
                 view: str = "") -> None:
        self.config = config or CoordConfig()
        self.world = world or World.from_env()
        self.member = member or self.world.member
        self.view = view
        self.address: Address = derive_address(
            local, default_run_id() if run_id is None else run_id, abstract=self.config.abstract, view=view
        )
        self._provider = provider
        self._policy = WatchPolicy(self.config.watch_warn_after, self.config.watch_fail_after)
        self._link: Link | None = None
        self._lock: asyncio.Lock | None = None
        self._pins: Counter[str] = Counter()  # this client's pins per key
        self._paths: dict[str, str] = {}  # local paths of the keys it holds pinned
        self._plans: dict[str, tuple[list[int], list[int], list[int], int]] = {}  # see PlanReports
        self._positions: dict[str, int] = {}
        self._epoch_hint: int | None = None
        self._closed = False
        self._opened = False
        self._rejoin: asyncio.Task[None] | None = None
        self.agent_pid: int | None = None
        self.started_agents = 0

    # -- lifecycle ----------------------------------------------------------------------

    async def _aopen(self) -> None:
        await self.aconnect()

    async def aconnect(self) -> None:
        """Join the node now (otherwise the first call does)."""
        await self._connected()

    async def aclose(self) -> None:
        """Say goodbye and close; idempotent. Pins still held are released by the agent."""
        if self._closed:
            return
        self._closed = True
        rejoin, self._rejoin = self._rejoin, None
        try:
            if rejoin is not None and not rejoin.done():
                rejoin.cancel()
                await asyncio.wait([rejoin])  # an outer cancellation still propagates
        finally:
            link, self._link = self._link, None
            if link is not None and not link.lost:
                link.notify({"op": "bye"})
                link.close()

    def __del__(self, _warn: Any = warnings.warn) -> None:
        if self._opened and not self._closed:
            _warn(f"unclosed {self!r}; use 'async with' or await aclose()", ResourceWarning, stacklevel=1)
            if self._link is not None:
                with contextlib.suppress(Exception):  # its loop may be gone already
                    self._link.close()

    def __repr__(self) -> str:
        return f"<AsyncNodeClient {self.member} agent={self.address}>"

    # -- calls --------------------------------------------------------------------------

    async def ensure(self, key: str, *, pin: bool = False, first: bool = False) -> str:
        """Make shard ``key`` present in the node's cache (downloaded once per node); return its path.

        A shard this client already holds pinned is answered here, without a round trip:
        a pinned shard cannot be evicted.

        Args:
            key: the shard's name relative to the cache root.
            pin: also pin it (atomically: it cannot be evicted between ready and pinned).
            first: the first batch of an iteration reads it: the node fetches it before
                the later shards of any reader.

        Raises:
            AstreamError: the provider's error (e.g. ``DownloadError``), as every waiter sees it.
            WatchdogTimeout: no answer within ``watch_fail_after``.
        """
        return (await self.ensure_many([key], pin=pin, first=first))[0]

    async def ensure_many(self, keys: Sequence[str], *, pin: bool = False, first: bool = False) -> list[str]:
        """:meth:`ensure` several shards in one round trip; answers when all are ready.

        A loader that pins the window of shards its plan reads next pays one round trip
        per window instead of one per shard.

        Raises:
            AstreamError: the first failure among them (every key this call pinned is unpinned).
        """
        paths: list[str | None] = [self._paths.get(k) if self._pins[k] > 0 else None for k in keys]
        ask = [k for k, p in zip(keys, paths, strict=True) if p is None]
        if pin:
            if ask:
                await self._connected()  # a first hello must not carry these pins too
            for key in keys:
                self._pins[key] += 1
        extra = {"first": True} if first else {}
        if ask:
            try:
                if len(ask) == 1:
                    answer = await self._call({"op": "ensure", "key": ask[0], "pin": pin, **extra},
                                              watch=f"shard {ask[0]!r}",
                                              describe=lambda: self._inspect_shard(ask[0]))
                    got = [answer["path"]]
                else:
                    got = []
                    for start in range(0, len(ask), MAX_KEYS):
                        chunk = ask[start : start + MAX_KEYS]
                        answer = await self._call({"op": "ensure_many", "keys": chunk, "pin": pin, **extra},
                                                  watch=f"{len(chunk)} shards ({chunk[0]!r}...)",
                                                  describe=lambda chunk=chunk: self._inspect_shard(chunk[0]))
                        got.extend(answer["paths"])
            except BaseException:
                if pin:
                    for key in keys:
                        await self.unpin(key)
                raise
            fetched = dict(zip(ask, got, strict=True))
            paths = [p if p is not None else fetched[k] for k, p in zip(keys, paths, strict=True)]
            for key in ask:
                if self._pins[key] > 0:
                    self._paths[key] = fetched[key]
        return [p for p in paths if p is not None]

    async def refetch(self, key: str) -> str:
        """The file of ``key`` the node gave this client is gone (``FileNotFoundError``): have
        the node look again, fetch it anew if it is gone indeed, and return its path.

        The client's pins of ``key`` stay as they are (the node keeps counting them).

        Raises:
            AstreamError: the fetch failed, as for :meth:`ensure`.
        """
        self._paths.pop(key, None)
        answer = await self._call({"op": "missing", "key": key}, watch=f"shard {key!r}",
                                  describe=lambda: self._inspect_shard(key))
        path: str = answer["path"]
        if self._pins[key] > 0:
            self._paths[key] = path
        return path

    async def prefetch(self, keys: Sequence[str], *, first: bool = False) -> None:
        """Ask the node to start fetching ``keys`` now, without waiting or pinning (one-way).

        A loader walking its epoch plan announces the shards it will read soon; a later
        :meth:`ensure` of one of them joins its download or finds it done. A prefetch
        that fails is forgotten: the ``ensure`` that needs the shard tries again.
        ``first``: as for :meth:`ensure`. A prefetch lasts while this client is connected:
        see :meth:`withdraw`.
        """
        link = await self._connected()
        extra = {"first": True} if first else {}
        for start in range(0, len(keys), MAX_KEYS):
            link.notify({"op": "prefetch", "keys": list(keys[start : start + MAX_KEYS]), **extra})

    async def withdraw(self, keys: Sequence[str]) -> None:
        """Take back this client's :meth:`prefetch` of ``keys`` (one-way; leaving the node does
        it for all of them): a transfer that nobody else asked for, waits for or pins is
        cancelled, and the link goes to what is needed instead."""
        link = self._link
        if link is None or link.lost:
            return  # not connected: the agent forgot this client's prefetches when it left
        for start in range(0, len(keys), MAX_KEYS):
            link.notify({"op": "withdraw", "keys": list(keys[start : start + MAX_KEYS])})

    async def pin(self, key: str) -> None:
        """Pin ``key`` node-wide: eviction will not touch it until every pin is released.

        Pins are counted here; the agent hears only of this client's first pin and last
        unpin of a key (one-way messages, no round trip).
        """
        link = await self._connected()
        self._pins[key] += 1
        if self._pins[key] == 1:
            link.notify({"op": "pin", "key": key})

    async def unpin(self, key: str) -> None:
        """Release one pin of ``key``; unknown keys are ignored."""
        if self._pins[key] <= 0:
            self._pins.pop(key, None)
            return
        self._pins[key] -= 1
        if self._pins[key]:
            return
        del self._pins[key]
        self._paths.pop(key, None)
        if self._link is not None and not self._link.lost:
            self._link.notify({"op": "unpin", "key": key})

    @contextlib.asynccontextmanager
    async def pinned(self, key: str) -> AsyncIterator[str]:
        """Ensure and pin ``key`` for the ``async with`` block; yields its local path."""
        path = await self.ensure(key, pin=True)
        try:
            yield path
        finally:
            await self.unpin(key)

    async def barrier(self, name: str, parties: int | Sequence[str] | None = None, *,
                      timeout: float | None = None) -> None:
        """Wait until every party arrived at barrier ``name``.

        Args:
            name: the barrier's name (reusable once it completed).
            parties: a count, or the member names that must arrive; default every worker
                of this node (``world.node_members()``).
            timeout: seconds; default ``config.barrier_timeout``.

        Raises:
            BarrierTimeout: not every party arrived in time; names the missing.
            CoordinationError: a party died; names it.
        """
        await self._arrive("barrier", name, parties, timeout)

    async def begin_epoch(self, parties: int | Sequence[str] | None = None, *, timeout: float | None = None,
                          name: str = "iter", resume_epoch: int | None = None) -> int:
        """Meet the node's other parties at the start of an iteration; return the epoch to run.

        All parties get the same number; the node's counter then advances by one (MosaicML
        advances it at the start of iteration: spec 4.8). ``resume_epoch`` first sets the
        counter, as :meth:`set_epoch` does, in the same round trip (a resume's first batch
        waits for it).
        """
        answer = await self._arrive("begin_epoch", name, parties, timeout,
                                    {} if resume_epoch is None else {"epoch": resume_epoch})
        epoch: int = answer["epoch"]
        self._epoch_hint = epoch + 1
        return epoch

    async def set_epoch(self, epoch: int) -> None:
        """Set the node's next epoch (on resumption)."""
        await self._call({"op": "set_epoch", "epoch": epoch})
        self._epoch_hint = epoch

    async def get_epoch(self) -> int:
        """The epoch the next :meth:`begin_epoch` will return."""
        epoch: int = (await self._call({"op": "get_epoch"}))["epoch"]
        self._epoch_hint = epoch
        return epoch

    async def stats(self) -> dict[str, Any]:
        """The agent's counters and gauges (clients, pins, fetches, provider stats...)."""
        stats: dict[str, Any] = (await self._call({"op": "stats"}))["stats"]
        return stats

    # -- machinery ----------------------------------------------------------------------

    async def _arrive(self, op: str, name: str, parties: int | Sequence[str] | None,
                      timeout: float | None, extra: dict[str, Any] | None = None) -> dict[str, Any]:
        if parties is None:
            parties = list(self.world.node_members())
        wanted: int | list[str] = parties if isinstance(parties, int) else list(parties)
        timeout = self.config.barrier_timeout if timeout is None else timeout
        loop = asyncio.get_running_loop()
        deadline = loop.time() + timeout
        message = {"op": op, "name": name, "parties": wanted, "timeout": timeout, **(extra or {})}
        try:
            return await within(
                timeout + min(5.0, 0.5 + timeout / 2),  # the agent answers first unless it hangs
                self._call(message, watch=f"barrier {name!r}", describe=lambda: self._inspect_barrier(name),
                           deadline=deadline),
            )
        except asyncio.TimeoutError as exc:
            if isinstance(exc, CoordinationError):  # the agent's or the watchdog's own answer
                raise
            raise BarrierTimeout(f"barrier {name!r}: no answer from the node agent {self.address} "
                                 f"within {timeout}s") from None

    async def _inspect_shard(self, key: str) -> str:
        return describe_shard(key, await self._call({"op": "inspect", "key": key}, retry=False))

    async def _inspect_barrier(self, name: str) -> str:
        return describe_barrier(name, await self._call({"op": "inspect_barrier", "name": name}, retry=False))

    async def _call(self, message: dict[str, Any], *, watch: str | None = None, describe: Any = None,
                    retry: bool = True, deadline: float | None = None) -> dict[str, Any]:
        for attempt in itertools.count():
            link = await self._connected()
            if deadline is not None and "timeout" in message:  # a retried barrier keeps its deadline
                message["timeout"] = max(0.0, deadline - asyncio.get_running_loop().time())
            future = link.request(dict(message))
            try:
                if watch is None:
                    return await future
                return await watched(future, what=watch, policy=self._policy, describe=describe)
            except AgentLost:
                if not retry or attempt >= _MAX_REELECTIONS:
                    raise
        raise AssertionError("unreachable")
