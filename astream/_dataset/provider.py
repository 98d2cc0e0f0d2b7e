"""The node's shard cache as the node agent's :class:`ShardProvider`.

The agent (one per node, see ``astream._coord``) owns one :class:`ShardEngine` per
stream; ranks and workers ask it for shards by key ``"<stream>/<shard>"`` (numbers).
The factory is picklable: it travels to the agent's process, which builds the
engines there from the index files the dataset already put in the local caches.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from astream._cache.engine import ShardEngine
from astream._coord.provider import StageCallback
from astream._format.index import INDEX_NAME, Index
from astream._storage.base import StorageOptions
from astream._storage.config import EMPTY, RemoteConfig
from astream._storage.executor import PriorityExecutor
from astream._storage.registry import StoragePool, configure
from astream._storage.retry import RetryPolicy, Timeouts
from astream.errors import ConfigError

__all__ = ["CacheProvider", "CacheProviderFactory", "EngineSpec", "shard_key"]


def shard_key(stream: int, shard: int) -> str:
    """The agent's key of a shard."""
    return f"{stream}/{shard}"


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


@dataclass(frozen=True)
class CacheProviderFactory:
    """Builds a :class:`CacheProvider` inside the agent."""

    streams: tuple[EngineSpec, ...]
    max_concurrency: int = 8
    pinned_at_once: int = 2

    def __call__(self) -> CacheProvider:
        return CacheProvider(self.streams, self.max_concurrency, self.pinned_at_once)


class CacheProvider:
    """One :class:`ShardEngine` per stream behind the agent's provider protocol.

    Agent pins map onto one engine pin per shard: the engine keeps a shard that any
    process of the node holds, and may evict it once nobody does.
    """

    def __init__(self, streams: Sequence[EngineSpec], max_concurrency: int, pinned_at_once: int) -> None:
        self._specs = list(streams)
        self._max_concurrency = max_concurrency
        self._pinned_at_once = pinned_at_once
        self._engines: list[ShardEngine] = []
        self._pins: dict[str, int] = {}
        self._held: set[str] = set()
        # Streams share HTTP sessions (one pool per distinct transfer settings) and one
        # thread pool for hashing, decompression and file writes.
        self._pools: dict[StorageOptions, StoragePool] = {}
        self._executor: PriorityExecutor | None = None

    async def rebuild(self) -> None:
        """Build and start the engines; each scans its cache folder (the disk is the truth)."""
        self._executor = PriorityExecutor(min(4, os.cpu_count() or 1) + 1)
        for spec in self._specs:
            root = os.path.join(spec.local, spec.split) if spec.split else spec.local
            index = Index.load(os.path.join(root, INDEX_NAME))
            options = StorageOptions(
                timeouts=Timeouts(download=spec.download_timeout),
                retry=RetryPolicy(retries=spec.download_retry),
            )
            if spec.remote is not None:
                options = configure(spec.remote, spec.storage_options, options)
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
        engine, shard = self._engine(key)
        return engine.path(shard) if engine.is_ready(shard) else None

    async def ensure(self, key: str, stage: StageCallback) -> str:
        engine, shard = self._engine(key)
        stage("download")
        path = await engine.ensure(shard)  # pinned for us while we decide
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
            if key in self._held:
                self._held.discard(key)
                engine.unpin(shard)

    def stats(self) -> dict[str, Any]:
        totals: dict[str, Any] = {}
        for engine in self._engines:
            for name, value in engine.stats.snapshot().items():
                totals[name] = totals.get(name, 0) + value
        return totals

    async def aclose(self) -> None:
        engines, self._engines = self._engines, []
        for engine in engines:
            await engine.aclose()
        pools, self._pools = list(self._pools.values()), {}
        for pool in pools:
            await pool.aclose()
        executor, self._executor = self._executor, None
        if executor is not None:
            executor.shutdown(wait=False)
