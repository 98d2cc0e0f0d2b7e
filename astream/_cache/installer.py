"""Installing one shard in the cache: fetch (or find) its files, check, decompress, rename.

The installation half of :class:`~astream._cache.engine.ShardEngine` (which owns the
state it uses: the cache, the stats, the transfer slots and the thread pool); the other
half, in ``engine.py``, decides *when* a shard is installed and keeps its pins.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import time
from concurrent.futures import Executor

from astream._cache.cache import ShardCache, ShardFile, shard_files
from astream._cache.durability import BackgroundSync
from astream._cache.install import CorruptFile, ShardSink, verify_files
from astream._cache.ranged import fetch_ranges
from astream._cache.slots import Slots
from astream._cache.stats import CacheStats
from astream._cache.throttle import Aimd
from astream._format.columns import columns_of
from astream._format.compression import get_codec
from astream._format.index import Index, ShardInfo
from astream._storage.base import Storage
from astream._storage.registry import StoragePool, join_url
from astream.errors import CacheError, ConfigError, HashMismatchError, ShardFormatError

__all__ = ["Installation", "check_hashes_present"]


def check_hashes_present(index: Index, algo: str) -> None:
    """Refuse ``validate_hash=algo`` unless every stored file of ``index`` has that digest
    (known from the index's columns; the shards are walked only to name the one without)."""
    if algo in columns_of(index).algos:
        return
    for shard in index.shards:
        stored = shard.stored
        if algo not in stored.hashes:
            have = ", ".join(sorted(stored.hashes)) or "none"
            raise ConfigError(
                f"validate_hash={algo!r} but index.json has no {algo} digest for "
                f"{stored.basename} (it has: {have}); pick one of those or drop validate_hash"
            )


class Installation:
    """How a shard's files come into place (mixed into :class:`ShardEngine`, which sets these)."""

    index: Index
    cache: ShardCache
    stats: CacheStats
    validate_hash: str | None
    remote_root: str | None
    _executor: Executor
    _sync: BackgroundSync | None
    _fsync: bool
    _slots: Slots
    _aimd: Aimd
    _fetched_before: set[int]
    _storage: Storage | None
    _pool: StoragePool | None

    def _wake(self) -> None:
        raise NotImplementedError

    # -- TransferEvents (the backends report retries and bytes) ---------------------------------
    def on_retry(self, url: str, attempt: int, cause: BaseException, throttled: bool) -> None:
        self.stats.retries += 1
        if throttled:
            self.stats.throttled += 1
            self._slots.limit = self.stats.concurrency = self._aimd.on_throttle()

    def on_bytes(self, count: int) -> None:
        self.stats.bytes_downloaded += count
        self.stats.epoch_bytes_downloaded += count

    def _backend(self, url: str) -> Storage:
        if self._storage is not None:
            return self._storage
        assert self._pool is not None
        return self._pool.get(url)

    def _check_algo(self, shard: ShardInfo) -> str | None:
        """The hash to check a shard already on disk with: validate_hash, else the fastest one known."""
        if self.validate_hash:
            return self.validate_hash
        known = set(shard.stored.hashes) | set(shard.raw_data.hashes)
        for algo in ("xxh3_64", "xxh64", "xxh128", "xxh3_128", "xxh32", "blake2b", "sha1", "md5", "sha256"):
            if algo in known:
                return algo
        return next(iter(sorted(known)), None)

    async def _install(self, i: int, verify: bool, priority: int) -> None:
        shard = self.index.shards[i]
        files = shard_files(shard)
        loop = asyncio.get_running_loop()
        if verify:
            try:
                problem = await loop.run_in_executor(
                    self._executor, verify_files, self.cache, files, self._check_algo(shard)
                )
            except BaseException:
                self.cache.entries[i].check_abandoned()  # still there, just not verified
                self._wake()
                raise
            if problem is None:
                self.cache.entries[i].check_passed()
                self._wake()
                return
            self.stats.hash_failures += 1
            if self.cache.local_only:
                self.cache.entries[i].check_abandoned()
                self._wake()
                raise HashMismatchError(f"{problem}; the local dataset is corrupt")
            self.cache.delete_files(i)
            self.cache.forget(i)
            self.cache.begin(i)
        try:
            fetched = False
            for attempt in range(2):
                try:
                    for f in files:
                        fetched |= await self._install_file(f, shard.compression, attempt > 0, priority)
                    break
                except CorruptFile as exc:
                    if exc.hash_mismatch:
                        self.stats.hash_failures += 1
                    if attempt == 1 or self.cache.local_only:
                        cls = HashMismatchError if exc.hash_mismatch else ShardFormatError
                        tries = "" if self.cache.local_only else " (downloaded twice)"
                        raise cls(f"{exc}{tries}; the remote copy is corrupt or index.json is stale") from exc
            self.cache.done(i)
            if fetched:
                self.stats.shards_downloaded += 1
                if i in self._fetched_before:
                    self.stats.redownloads += 1
                self._fetched_before.add(i)
        except BaseException:
            if not self.cache.local_only:
                with contextlib.suppress(CacheError):
                    self.cache.delete_files(i)
            self.cache.forget(i)
            raise
        finally:
            self._wake()

    async def _install_file(self, f: ShardFile, compression: str | None, fresh: bool, priority: int) -> bool:
        """Bring one file of a shard into place; returns whether it came over the network."""
        loop = asyncio.get_running_loop()
        raw_final = self.cache.path(f.raw)
        # A stat is cheap; doing it inline keeps tasks reaching the transfer slots in plan order.
        if _stat_size(raw_final) == f.raw.bytes and not fresh:
            return False
        codec = get_codec(compression) if (f.zip is not None and compression) else None
        stored = f.zip if codec is not None and f.zip is not None else f.raw
        algo = self.validate_hash
        digest = stored.hashes.get(algo) if algo else None
        local_zip = self.cache.path(f.zip) if codec is not None and f.zip is not None else None
        keep = self.cache.keep_zip and not self.cache.local_only

        sync = self._sync
        if sync is not None:
            sync.start_prepare()  # the marker is made while the bytes come

        def new_sink(zip_path: str | None, name: str) -> ShardSink:
            return ShardSink(
                raw_final, f.raw.bytes, codec=codec, zip_path=zip_path, hash_algo=algo if digest else None,
                digest=digest, name=name, executor=self._executor, fsync=self._fsync, priority=priority,
                syncer=sync,
            )

        if local_zip is not None and not fresh and _stat_size(local_zip) == stored.bytes:
            try:
                if sync is not None:
                    await self._prepare_sync(sync)
                await new_sink(None, local_zip).install_from(local_zip)
                return False
            except CorruptFile:
                if self.cache.local_only:
                    raise
                with contextlib.suppress(FileNotFoundError):
                    await loop.run_in_executor(self._executor, os.unlink, local_zip)
        if self.cache.local_only or self.remote_root is None:
            raise CacheError(
                f"{raw_final} is missing (or has the wrong size) and there is no remote to fetch it from"
            )
        url = join_url(self.remote_root, f.source.file if f.source is not None else stored.basename)
        sink = new_sink(local_zip if keep else None, url)

        async def complete() -> None:
            if sync is not None:
                await self._prepare_sync(sync)
            await sink.finish()
            self.stats.decode_s += sink.busy_s

        try:
            # The slot goes as soon as the bytes are in: the end of the decoding, the
            # durability marker and the rename are not the link's business, and readers
            # do not wait for them (they read the file as it arrives, see
            # astream._dataset.read.arriving), so the next transfer starts at once.
            async with self._slots.hold(priority):
                self._wake()
                began = time.perf_counter()
                if f.source is not None:
                    await fetch_ranges(self._backend(url), url, f.source, sink, self.on_bytes)
                else:
                    await self._backend(url).fetch_into(url, sink, size=stored.bytes, events=self)
                self.stats.download_s += time.perf_counter() - began
            self._slots.limit = self.stats.concurrency = self._aimd.on_success()
            self._slots.wake()
            await complete()
        except BaseException:
            sink.abort()
            raise
        return True


    async def _prepare_sync(self, sync: BackgroundSync) -> None:
        try:
            await sync.prepare()
        except OSError as exc:
            raise CacheError(f"cannot write {sync.marker}: {exc.strerror or exc}") from exc


def _stat_size(path: str) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return -1
