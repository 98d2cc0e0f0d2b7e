"""The shard engine: brings shards into the node's cache, concurrently and safely.

:class:`ShardEngine` owns the storage backends, a thread pool for hashing,
decompression and file writes, and a :class:`ShardCache`. Shards are requested in
two steps, so a prefetcher can keep plan order while transfers overlap:

- :meth:`ShardEngine.reserve` pins a shard and, if it is not in the cache, waits for
  room (evicting unpinned shards: read farthest away first when the node's plan is
  given, else least recently used) and starts its installation; :meth:`ShardEngine.try_reserve`
  does so for a prefetch, only if room can be made now;
- :meth:`ShardEngine.wait_ready` waits for that installation and returns the path.

:meth:`ShardEngine.ensure` does both; :meth:`ShardEngine.unpin` releases a pin (a
shard whose last pin goes while it is still downloading is cancelled). Transfers run
at most ``max_concurrency`` at once, fewer while the remote throttles (AIMD).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import os
import warnings
from collections.abc import AsyncIterator
from concurrent.futures import Executor

from astream._cache.cache import ShardCache, State
from astream._cache.durability import BackgroundSync
from astream._cache.install import remove_stale_temporaries
from astream._cache.installer import check_hashes_present
from astream._cache.reservations import Reservations
from astream._cache.slots import Slots
from astream._cache.stats import CacheStats
from astream._cache.throttle import Aimd
from astream._format.hashing import check_algorithm
from astream._format.index import Index
from astream._resource import AsyncResource
from astream._storage.base import Storage, StorageOptions
from astream._storage.executor import PriorityExecutor
from astream._storage.local import local_path_of
from astream._storage.registry import StoragePool, join_url, scheme_of
from astream._units import parse_bytes
from astream.errors import UsageError

__all__ = ["ShardEngine"]

class ShardEngine(Reservations, AsyncResource):
    """Downloads, validates, decompresses and caches the shards of one dataset (or split).

    Reserving room is :class:`~astream._cache.reservations.Reservations`'; installing a
    shard's files, :class:`~astream._cache.installer.Installation`'s.

    Args:
        index: the dataset's parsed index.json.
        local: the local cache directory (the dataset itself when ``remote`` is None).
        remote: where the shards live (path, ``file://``, ``http(s)://``, ``s3://``), or None.
        split: a sub-directory of both ``remote`` and ``local``.
        cache_limit: bytes (or a string like ``"10gb"``) the cache may hold, or None.
        validate_hash: check each downloaded file with this algorithm from index.json.
        keep_zip: keep the compressed files beside the decompressed ones.
        max_concurrency: transfers at once (lowered while the remote throttles).
        options: timeouts, retries and pool sizes of the backends.
        storage: a backend to use instead of one from the registry (never closed here).
        pool: a :class:`StoragePool` shared with other engines on the same loop (one HTTP
            session for all streams); never closed here. Stats stay per engine.
        executor: a thread pool for file work (never shut down here); default: a private one.
        fsync: make installed files durable. A shard is handed over once its complete file
            is renamed into place; the fsync runs after that on a helper thread, and
            :meth:`aclose` waits for it. Until then a marker file in the cache directory
            makes a run after a power cut check those shards (see
            :mod:`astream._cache.durability`). Without ``fsync`` a process crash still
            never leaves a bad shard (files appear by rename once complete); a power cut
            could, so shards written before the last boot are then checked against
            index.json's digest (or fetched again) before use.
        pinned_at_once: how many shards consumers hold at the same time (for the limit check).
        initial_concurrency: transfers at first; doubles per success up to ``max_concurrency``
            (slow start: the first shard gets the whole link). None starts at the maximum.

    Raises:
        CacheError: ``cache_limit`` cannot hold the shards that must be on disk at once.
        ConfigError: a bad parameter, or ``validate_hash`` names a hash index.json lacks.
    """

    def __init__(
        self,
        index: Index,
        local: str,
        remote: str | None = None,
        split: str | None = None,
        *,
        cache_limit: int | str | None = None,
        validate_hash: str | None = None,
        keep_zip: bool = False,
        max_concurrency: int = 8,
        options: StorageOptions | None = None,
        storage: Storage | None = None,
        pool: StoragePool | None = None,
        executor: Executor | None = None,
        fsync: bool = True,
        pinned_at_once: int = 1,
        initial_concurrency: int | None = 1,
    ) -> None:
        root = os.path.join(local, split) if split else local
        self.remote_root = join_url(remote, split) if remote is not None else None
        local_only = self.remote_root is None or (
            scheme_of(self.remote_root) in ("", "file")
            and os.path.realpath(local_path_of(self.remote_root)) == os.path.realpath(root)
        )
        limit = None if cache_limit is None else parse_bytes(cache_limit, "cache_limit")
        self.validate_hash = None if validate_hash is None else check_algorithm(validate_hash, "validate_hash")
        if self.validate_hash:
            check_hashes_present(index, self.validate_hash)
        self.index = index
        self.cache = ShardCache(index, root, limit, keep_zip, local_only, pinned_at_once)
        self._aimd = Aimd(max_concurrency, initial=initial_concurrency)
        self.stats = CacheStats(concurrency=self._aimd.limit)
        self._slots = Slots(self._aimd.limit)
        self._storage = storage
        self._pool = pool if pool is not None or storage is not None else StoragePool(options)
        self._owns_pool = pool is None and storage is None
        self._executor: Executor = executor or PriorityExecutor(min(4, os.cpu_count() or 1) + 1)
        self._order = itertools.count(1)  # reservation order = priority of the file work
        self._priorities: dict[int, int] = {}  # of the installs running or waiting
        self._owns_executor = executor is None
        self._fsync = fsync
        self._sync = BackgroundSync(self.cache.root) if fsync else None
        self._tasks: dict[int, asyncio.Task[None]] = {}
        self._cancelled: dict[int, asyncio.Task[None]] = {}  # transfers cancelled, maybe not yet done
        self._fetched_before: set[int] = set()  # shards this engine downloaded (re-downloads count)
        self._change: asyncio.Event | None = None
        self._started = False
        self._closed = False

    # -- lifecycle ----------------------------------------------------------------------------
    async def start(self) -> None:
        """Remove stale temporaries and find the shards already in the cache (idempotent)."""
        if self._closed:
            raise UsageError("this ShardEngine is closed")
        if self._started:
            return
        self._started = True
        self._change = asyncio.Event()
        loop = asyncio.get_running_loop()

        def scan() -> list[int]:
            if os.path.isdir(self.cache.root):
                remove_stale_temporaries(self.cache.root)
            return self.cache.scan(trust_unsynced=self._fsync)

        await loop.run_in_executor(self._executor, scan)
        self.stats.cache_bytes = self.cache.used
        if self._sync is not None and not self._closed:  # (closed meanwhile: its helper is gone)
            self._sync.adopt(self.cache.orphan_markers)
            if not self.cache.local_only and not self.cache.entries.all_ready():
                # Something will be fetched: make the marker now (two fsyncs), not when the
                # first shard is about to be renamed, where the consumer waits for it.
                self._sync.start_prepare()

    async def aclose(self) -> None:
        """Cancel transfers in flight (leaving no temporaries), close backends; idempotent."""
        if self._closed:
            return
        self._closed = True
        tasks = [t for t in self._tasks.values() if not t.done()]
        for task in tasks:
            task.cancel()
        try:
            if tasks:
                await asyncio.shield(asyncio.gather(*tasks, return_exceptions=True))
            await self._settle_durability()
        finally:
            self._tasks.clear()
            if self._sync is not None:
                self._sync.close()
            if self._pool is not None and self._owns_pool:
                await self._pool.aclose()
            if self._owns_executor:
                self._executor.shutdown(wait=False, cancel_futures=True)

    async def _settle_durability(self) -> None:
        """Wait for background fsyncs; drop markers of earlier runs once their shards are checked."""
        if self._sync is not None and not await self._sync.drain():
            warnings.warn(
                f"fsync of shards in {self.cache.root} failed or did not finish; after a power cut "
                "they will be checked before use", RuntimeWarning, stacklevel=3,
            )
        stale = self.cache.stale_markers
        if stale and not any(e.suspect for _, e in self.cache.entries.touched()):
            # Every shard such a marker made suspect has been checked, replaced or removed.
            def remove() -> None:
                for marker in stale:
                    with contextlib.suppress(FileNotFoundError):
                        os.unlink(marker.path)

            await asyncio.get_running_loop().run_in_executor(self._executor, remove)
            self.cache.stale_markers = []

    async def _aopen(self) -> None:
        await self.start()

    def _unclosed(self) -> bool:
        return bool(getattr(self, "_started", False) and not getattr(self, "_closed", True))

    # -- the shard API ------------------------------------------------------------------------
    def path(self, i: int) -> str:
        """The local path of shard ``i``'s data file (valid while it is ready)."""
        return self.cache.raw_path(i)

    def is_ready(self, i: int) -> bool:
        return self.cache.entries[i].state is State.READY

    def servable(self, i: int) -> str | None:
        """The path of shard ``i`` if it may be served now as it is, else None (then
        :meth:`reserve` fetches or checks it): ready, not waiting for a check (found by a
        new run with ``validate_hash``, or suspect after a power cut), and its files on disk
        with the sizes the index gives. A ready shard whose files are gone is forgotten."""
        entry = self.cache.entries[i]
        if entry.state is not State.READY or entry.needs_check(bool(self.validate_hash)):
            return None
        if self.cache.vanished(i):
            self.stats.vanished += 1
            self._wake()
            return None
        return self.cache.raw_path(i)

    def recheck(self, i: int) -> bool:
        """A reader could not open shard ``i``'s file: forget it if it is gone (True)."""
        if self.cache.vanished(i):
            self.stats.vanished += 1
            self._wake()
            return True
        return False

    def is_absent(self, i: int) -> bool:
        return self.cache.entries[i].state is State.ABSENT

    def pin(self, i: int) -> None:
        """Keep shard ``i`` from eviction (it must be ready or reserved)."""
        self.cache.pin(i)

    def unpin(self, i: int) -> None:
        """Release one pin; a shard still downloading with no pins left is cancelled."""
        self.cache.unpin(i)
        entry = self.cache.entries[i]
        if entry.pins == 0:
            task = self._tasks.get(i)
            if task is not None:
                if task.done():
                    del self._tasks[i]
                else:
                    task.cancel()
                    self._cancelled[i] = task
                    self.stats.cancelled += 1
        self._wake()

    def _wake(self) -> None:
        self.stats.cache_bytes = self.cache.used
        self.stats.peak_cache_bytes = max(self.stats.peak_cache_bytes, self.cache.used)
        self.stats.in_flight = self._slots.active
        if self._change is not None:
            self._change.set()

    def new_epoch(self) -> None:
        """The node began an epoch: restart the per-epoch counters."""
        self.stats.epoch_bytes_downloaded = 0

    async def wait_ready(self, i: int) -> str:
        """Wait until reserved shard ``i`` is installed; returns its data file's path.

        Raises:
            DownloadError, HashMismatchError, CacheError, ShardFormatError: installing failed.
        """
        task = self._tasks.get(i)
        if task is not None:
            await asyncio.shield(task)
        elif self.cache.entries[i].state is not State.READY:
            raise UsageError(f"shard {i} was not reserved; call reserve() first")
        return self.cache.raw_path(i)

    async def ensure(self, i: int) -> str:
        """Reserve and wait: returns the path of shard ``i``, pinned (call :meth:`unpin` after)."""
        await self.reserve(i)
        try:
            return await self.wait_ready(i)
        except BaseException:
            self.unpin(i)
            raise

    async def settle(self, shards: list[int]) -> None:
        """Wait until no installation of ``shards`` is running (after unpinning cancelled them)."""
        tasks = {t for i in shards if (t := self._tasks.get(i)) is not None and not t.done()}
        if tasks:
            await asyncio.shield(asyncio.gather(*tasks, return_exceptions=True))

    @contextlib.asynccontextmanager
    async def use(self, i: int) -> AsyncIterator[str]:
        """``async with engine.use(i) as path:`` — shard ``i`` is pinned inside the block."""
        path = await self.ensure(i)
        try:
            yield path
        finally:
            self.unpin(i)
