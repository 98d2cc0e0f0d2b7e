"""The node's shard cache as the node agent's :class:`ShardProvider`.

The agent (one per node, see ``astream._coord``) owns one :class:`ShardEngine` per
stream; ranks and workers ask it for shards by key ``"<stream>/<shard>"`` (numbers).
The factory is picklable: it travels to the agent's process (or thread) with the
indexes the dataset already holds, which the engines are built from. It does not read
them back from the ``index.json`` files in the local caches: that is a parse on the
first batch's path, and such a file may by then be another dataset's (one on the same
``local`` with other Parquet ``columns`` rewrites it), whose shards would be served
under this one's keys.

With a ``cache_limit`` the readers of the node also tell the agent their epoch's shard
uses and how far they have come (:class:`~astream._cache.eviction.NodePlan`): room is
made by evicting the shard next used farthest away, and the provider downloads ahead
what the readers will need within their ``predownload`` window, evicting only shards
needed later than the one it fetches. A reader's own request preempts such a prefetch
when the cache is full.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any, cast

import numpy as np
import numpy.typing as npt
import xxhash

from astream._cache.engine import ShardEngine
from astream._cache.eviction import NodePlan
from astream._cache.index_file import node_index
from astream._coord.provider import StageCallback
from astream._format.columns import columns_of
from astream._format.index import INDEX_NAME, Index
from astream._storage.base import StorageOptions
from astream._storage.config import EMPTY, RemoteConfig
from astream._storage.executor import PriorityExecutor
from astream._storage.registry import StoragePool, transfer_options
from astream.errors import ConfigError

__all__ = [
    "CacheProvider",
    "CacheProviderFactory",
    "EngineSpec",
    "decode_use",
    "encode_use",
    "encode_uses",
    "shard_key",
    "view_of",
]

log = logging.getLogger("astream.cache")

# A need that finds the cache full of pins, with nothing downloading and no pin released
# for this long, can only be a consumer outside the sizing (a large get_batch beside the
# iteration): it fails instead of waiting forever.
STUCK_AFTER = 30.0


def shard_key(stream: int, shard: int) -> str:
    """The agent's key of a shard."""
    return f"{stream}/{shard}"


def encode_use(stream: int, shard: int) -> int:
    """A shard as one int in a reader's plan message."""
    return (stream << 32) | shard


def encode_uses(streams: npt.NDArray[np.int64], shards: npt.NDArray[np.int64]) -> list[int]:
    """:func:`encode_use` of many (a reader's plan), vectorised."""
    return ((streams.astype(np.int64) << 32) | shards.astype(np.int64)).tolist()  # type: ignore[no-any-return]


def decode_use(use: int) -> tuple[int, int]:
    return use >> 32, use & 0xFFFFFFFF


def parse_key(key: str) -> tuple[int, int]:
    try:
        stream, shard = key.split("/")
        return int(stream), int(shard)
    except ValueError:
        raise ConfigError(f"shard key {key!r} is not '<stream>/<shard>'") from None


@dataclass(frozen=True)
class EngineSpec:
    """What the agent needs to build one stream's engine (picklable)."""

    local: str
    remote: str | None
    split: str | None
    validate_hash: str | None
    keep_zip: bool
    download_retry: int
    download_timeout: float
    cache_limit: int | None
    storage_options: RemoteConfig = EMPTY

    def transfer_options(self) -> StorageOptions:
        """How this stream's remote is talked to (the engine's, and the ranged reader's)."""
        return transfer_options(self.remote, self.storage_options, timeout=self.download_timeout,
                                retries=self.download_retry)


@dataclass(frozen=True)
class CacheProviderFactory:
    """Builds a :class:`CacheProvider` inside the agent."""

    streams: tuple[EngineSpec, ...]
    max_concurrency: int = 8
    pinned_at_once: int = 2
    # Each stream's index as the dataset parsed it (None: read each stream's index.json).
    indexes: tuple[Index, ...] | None = field(default=None, compare=False, repr=False)

    def __post_init__(self) -> None:
        if self.indexes is not None and len(self.indexes) != len(self.streams):
            raise ConfigError(f"{len(self.indexes)} indexes for {len(self.streams)} streams")

    def __call__(self) -> CacheProvider:
        return CacheProvider(self.streams, self.max_concurrency, self.pinned_at_once, self.indexes)


def view_of(factory: CacheProviderFactory) -> str:
    """The identity of the dataset a factory serves: every stream's folder, remote, split and
    cache settings, and every shard its index describes (names, sizes, digests, columns).

    The node agent's address is derived from it and the agent checks it at each hello: two
    datasets of one job that share ``local`` (a train and a val split, two remotes, other
    Parquet columns) meet at two agents, each with its own books and indexes, and never
    read each other's shards under the same keys (issue 32, finding 1).
    """
    digest = xxhash.xxh3_128()
    for i, spec in enumerate(factory.streams):
        digest.update(json.dumps([os.path.realpath(spec.local), spec.remote, spec.split, spec.validate_hash,
                                  spec.keep_zip, spec.cache_limit]).encode())
        if factory.indexes is None:
            continue
        digest.update(b"\0index\0")
        # (every shard's view, hashed once in order: by the binary index's builder, or here)
        digest.update(columns_of(factory.indexes[i]).view_digest.encode())
    return digest.hexdigest()[:24]


Key = tuple[int, int]


class CacheProvider:
    """One :class:`ShardEngine` per stream behind the agent's provider protocol.

    Agent pins map onto one engine pin per shard: the engine keeps a shard that any
    process of the node holds, and may evict it once nobody does.
    """

    def __init__(self, streams: Sequence[EngineSpec], max_concurrency: int, pinned_at_once: int,
                 indexes: Sequence[Index] | None = None) -> None:
        self._specs = list(streams)
        self._indexes = None if indexes is None else list(indexes)
        self._max_concurrency = max_concurrency
        self._pinned_at_once = pinned_at_once
        self._engines: list[ShardEngine] = []
        self._pins: dict[str, int] = {}
        self._held: set[str] = set()
        self._plan = NodePlan()  # (stream, shard) keys
        self._prefetching: dict[Key, asyncio.Task[None]] = {}
        self._urgent: set[str] = set()  # keys a reader's first batch needs, until installed
        self._pass: asyncio.Handle | None = None
        self._released = time.monotonic()  # when a pin last went (for the stuck check)
        # Streams share HTTP sessions (one pool per distinct transfer settings) and one
        # thread pool for hashing, decompression and file writes.
        self._pools: dict[StorageOptions, StoragePool] = {}
        self._executor: PriorityExecutor | None = None

    async def rebuild(self) -> None:
        """Build and start the engines; each scans its cache folder (the disk is the truth)."""
        self._executor = PriorityExecutor(min(4, os.cpu_count() or 1) + 1)
        for i, spec in enumerate(self._specs):
            if self._indexes is not None:
                index = self._indexes[i]
            else:
                root = os.path.join(spec.local, spec.split) if spec.split else spec.local
                index = node_index(os.path.join(root, INDEX_NAME))
            options = spec.transfer_options()
            pool = self._pools.get(options)
            if pool is None:
                pool = self._pools[options] = StoragePool(options)
            engine = ShardEngine(
                index, spec.local, spec.remote, spec.split, cache_limit=spec.cache_limit,
                validate_hash=spec.validate_hash, keep_zip=spec.keep_zip,
                max_concurrency=self._max_concurrency, options=options, pool=pool, executor=self._executor,
                pinned_at_once=self._pinned_at_once,
            )
            await engine.start()
            self._engines.append(engine)

    def _engine(self, key: str) -> tuple[ShardEngine, int]:
        stream, shard = parse_key(key)
        if not 0 <= stream < len(self._engines):
            raise ConfigError(f"shard key {key!r}: there is no stream {stream}")
        engine = self._engines[stream]
        if not 0 <= shard < len(engine.index.shards):
            raise ConfigError(f"shard key {key!r}: stream {stream} has no shard {shard}")
        return engine, shard

    def lookup(self, key: str) -> str | None:
        # Not merely ready: a shard found in the cache by a new run with validate_hash, or
        # suspect after a power cut, is checked first (the ensure that follows does it), and
        # one whose file is gone is fetched again (issue 32 finding 4, issue 31 item 2).
        engine, shard = self._engine(key)
        return engine.servable(shard)

    def recheck(self, key: str) -> bool:
        """A reader could not open ``key``'s file: forget it if it is gone (see ``Rechecked``)."""
        engine, shard = self._engine(key)
        return engine.recheck(shard)

    def _next_use(self, stream: int) -> Callable[[int], float] | None:
        if not self._plan.readers:
            return None
        plan = self._plan
        return lambda shard: plan.distance((stream, shard))

    def _make_way(self, stream: int) -> bool:
        """A reader's request finds no room: cancel the prefetch needed farthest away."""
        mine = [k for k in self._prefetching if k[0] == stream]
        if not mine:
            return False
        victim = max(mine, key=lambda k: (self._plan.distance(k), k))
        self._drop_prefetch(victim)
        return True

    def _stuck(self) -> bool:
        return time.monotonic() - self._released > STUCK_AFTER

    def hurry(self, key: str) -> None:
        """A reader's first batch needs ``key``: its transfer goes before later shards'."""
        try:
            engine, shard = self._engine(key)
        except ConfigError:
            return  # the ensure of that key reports it
        self._urgent.add(key)  # for an ensure that has yet to reserve it
        engine.hurry(shard)  # for a transfer already waiting

    async def ensure(self, key: str, stage: StageCallback) -> str:
        engine, shard = self._engine(key)
        stream = parse_key(key)[0]
        stage("download")
        try:
            await engine.reserve(shard, next_use=self._next_use(stream), make_way=lambda: self._make_way(stream),
                                 stuck=self._stuck if engine.cache.limit is not None else None,
                                 urgent=key in self._urgent)
        except BaseException:
            self._urgent.discard(key)
            raise
        try:
            path = await engine.wait_ready(shard)  # pinned for us while we decide
        except BaseException:
            engine.unpin(shard)
            raise
        finally:
            self._urgent.discard(key)
            self._schedule_pass()
        if self._pins.get(key, 0) > 0 and key not in self._held:
            self._held.add(key)  # keep the engine pin on behalf of the node's pins
        else:
            engine.unpin(shard)
        return path

    def on_pins_changed(self, key: str, pins: int) -> None:
        engine, shard = self._engine(key)
        if pins > 0:
            self._pins[key] = pins
            if key not in self._held and engine.is_ready(shard):
                engine.pin(shard)
                self._held.add(key)
        else:
            self._pins.pop(key, None)
            self._released = time.monotonic()
            if key in self._held:
                self._held.discard(key)
                engine.unpin(shard)
            self._schedule_pass()

    # -- the node's plan ------------------------------------------------------------------------
    def on_plan(self, reader: str, uses: Sequence[int], starts: Sequence[int], ends: Sequence[int],
                window: int) -> None:
        """A reader's shard uses this epoch (encoded by :func:`encode_use`) and look-ahead."""
        keys = [decode_use(u) for u in uses]
        self._plan.add(reader, keys, starts, ends, window=window)
        self._schedule_pass()

    def append_plan(self, reader: str, uses: Sequence[int], starts: Sequence[int], ends: Sequence[int]) -> None:
        self._plan.extend(reader, [decode_use(u) for u in uses], starts, ends)
        self._schedule_pass()

    def on_progress(self, reader: str, position: int) -> None:
        """A reader consumed everything before ``position``."""
        self._plan.advance(reader, position)
        self._released = time.monotonic()
        self._schedule_pass()

    def on_reader_gone(self, reader: str) -> None:
        self._plan.remove(reader)
        self._schedule_pass()

    def on_epoch(self, epoch: int) -> None:
        for engine in self._engines:
            engine.new_epoch()

    def _schedule_pass(self) -> None:
        if self._pass is None and self._plan.readers and self._engines:
            with contextlib.suppress(RuntimeError):  # no running loop: nothing to prefetch into
                self._pass = asyncio.get_running_loop().call_soon(self._prefetch_pass)

    def _prefetch_pass(self) -> None:
        """Start downloads of what the readers need next, nearest first, while room can be
        made from shards needed later (at most ``max_concurrency`` at once)."""
        self._pass = None
        plan = self._plan
        for distance, upcoming in plan.upcoming():
            if len(self._prefetching) >= self._max_concurrency:
                return
            key = cast(Key, upcoming)
            stream, shard = key
            if key in self._prefetching or not 0 <= stream < len(self._engines):
                continue
            engine = self._engines[stream]
            if engine.cache.limit is None or not engine.is_absent(shard):
                continue
            def next_use(i: int, stream: int = stream, d: float = distance) -> float:
                return plan.distance((stream, i), d)

            def soon(i: int, stream: int = stream, d: float = distance) -> bool:
                return plan.distance((stream, i)) < d

            if not engine.try_reserve(shard, next_use, soon):
                return  # farther shards would only have less to evict
            self._prefetching[key] = asyncio.get_running_loop().create_task(self._prefetch(key))

    async def _prefetch(self, key: Key) -> None:
        stream, shard = key
        engine = self._engines[stream]
        try:
            await engine.wait_ready(shard)
        except asyncio.CancelledError:
            raise
        except Exception as exc:  # the reader's own request tries again and reports it
            log.debug("astream: prefetch of shard %s failed: %s", key, exc)
        finally:
            if self._prefetching.pop(key, None) is not None:
                engine.unpin(shard)
            self._schedule_pass()

    def _drop_prefetch(self, key: Key) -> None:
        task = self._prefetching.pop(key, None)
        if task is not None:
            self._engines[key[0]].unpin(key[1])  # its last pin: the engine cancels the transfer
            task.cancel()

    def stats(self) -> dict[str, Any]:
        totals: dict[str, Any] = {}
        for engine in self._engines:
            for name, value in engine.stats.snapshot().items():
                totals[name] = totals.get(name, 0) + value
        totals["plan_readers"] = len(self._plan.readers)
        totals["prefetching"] = len(self._prefetching)
        return totals

    async def aclose(self) -> None:
        if self._pass is not None:
            self._pass.cancel()
            self._pass = None
        for key in list(self._prefetching):
            self._drop_prefetch(key)
        engines, self._engines = self._engines, []
        for engine in engines:
            await engine.aclose()
        pools, self._pools = list(self._pools.values()), {}
        for pool in pools:
            await pool.aclose()
        executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=False)
