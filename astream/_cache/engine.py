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
from collections.abc import AsyncIterator, Callable
from concurrent.futures import Executor

from astream._cache.cache import ShardCache, State
from astream._cache.durability import BackgroundSync
from astream._cache.install import remove_stale_temporaries
from astream._cache.installer import Installation, check_hashes_present
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
from astream.errors import CacheError, UsageError

__all__ = ["ShardEngine"]

# Added to the priority of work nobody needs for a first batch: the shards the node's
# readers read first (each rank's, each worker's) take the transfer slots before any
# reader's later shards, whichever order their requests came in.
_LATER = 1 << 48


class ShardEngine(Installation, AsyncResource):
    """Downloads, validates, decompresses and caches the shards of one dataset (or split).

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
            if not self.cache.local_only and any(e.state is not State.READY for e in self.cache.entries):
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
        if stale and not any(e.suspect for e in self.cache.entries):
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
