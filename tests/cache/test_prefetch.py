"""The prefetcher: plan order, bounded look-ahead and concurrency, back-pressure, cancellation."""
# ruff: noqa: ASYNC240, SIM117

from __future__ import annotations

import asyncio
import os
import shutil
import time
from pathlib import Path

import pytest
from cachekit import raw_bytes, temporaries, tree

from astream._cache import Prefetcher, ShardEngine
from astream._format.index import Index
from astream._storage import StorageOptions
from astream.errors import CacheError, ConfigError, RemoteNotFoundError
from astream.testing import Fault, LoopbackServer

Dataset = tuple[Path, Index]


async def wait_for(predicate: object, timeout: float = 3.0) -> None:
    deadline = time.monotonic() + timeout
    while not predicate():  # type: ignore[operator]
        assert time.monotonic() < deadline, "condition not reached"
        await asyncio.sleep(0.01)


async def test_shards_come_in_plan_order(server: LoopbackServer, dataset: Dataset, tmp_path: Path, options: StorageOptions) -> None:
    root, index = dataset
    plan = [2, 0, 3, 1, 0, 2]
    got = []
    async with ShardEngine(index, str(tmp_path / "c"), server.url, options=options) as engine:
        async with Prefetcher(engine, plan, predownload=100) as shards:
            async for lease in shards:
                with lease:
                    assert Path(lease.path).read_bytes() == raw_bytes(root, index, lease.shard)
                    got.append((lease.position, lease.shard))
        assert got == list(enumerate(plan))
        assert engine.stats.shards_downloaded == 4
        assert engine.stats.hits == 2
        assert engine.cache.pinned == []
    assert server.count("*.zstd") == 4


async def test_transfers_are_bounded_by_max_concurrency(
    server: LoopbackServer, dataset: Dataset, tmp_path: Path, options: StorageOptions
) -> None:
    _, index = dataset
    server.add(Fault("delay", match="*.zstd", seconds=0.15, times=None))
    async with ShardEngine(
        index, str(tmp_path / "c"), server.url, options=options, max_concurrency=2, initial_concurrency=None
    ) as engine:
        async with Prefetcher(engine, [0, 1, 2, 3], predownload=1000) as shards:
            async for lease in shards:
                lease.release()
        assert engine.stats.consumer_wait_s > 0.1
    assert server.max_active == 2


async def test_predownload_bounds_the_look_ahead(
    server: LoopbackServer, dataset: Dataset, tmp_path: Path, options: StorageOptions
) -> None:
    _, index = dataset  # 6 samples per shard
    async with ShardEngine(index, str(tmp_path / "c"), server.url, options=options) as engine:
        async with Prefetcher(engine, [0, 1, 2, 3], predownload=12) as shards:
            lease = await shards.__anext__()
            await wait_for(lambda: server.count("*.zstd") >= 3)
            await asyncio.sleep(0.1)
            assert server.count("*.zstd") == 3  # the shard in hand plus 12 samples ahead
            lease.release()


async def test_cache_limit_is_back_pressure(server: LoopbackServer, dataset: Dataset, tmp_path: Path, options: StorageOptions) -> None:
    _, index = dataset
    size = index.shards[0].raw_data.bytes
    async with ShardEngine(index, str(tmp_path / "c"), server.url, options=options, cache_limit=2 * size) as engine:
        async with Prefetcher(engine, [0, 1, 2, 3], predownload=1000) as shards:
            first = await shards.__anext__()
            await wait_for(lambda: server.count("*.zstd") >= 2)
            await asyncio.sleep(0.1)
            assert server.count("*.zstd") == 2  # no room for a third shard while 0 is held
            first.release()
            await wait_for(lambda: server.count("*.zstd") >= 3)
            async for lease in shards:
                lease.release()
        assert engine.stats.evictions == 2
        assert engine.stats.cache_bytes <= 2 * size


async def test_holding_too_many_shards_is_an_error_not_a_deadlock(
    server: LoopbackServer, dataset: Dataset, tmp_path: Path, options: StorageOptions
) -> None:
    _, index = dataset
    size = index.shards[0].raw_data.bytes
    async with ShardEngine(index, str(tmp_path / "c"), server.url, options=options, cache_limit=2 * size) as engine:
        async with Prefetcher(engine, [0, 1, 2, 3]) as shards:
            held = [await shards.__anext__(), await shards.__anext__()]
            with pytest.raises(CacheError, match=r"full of shards in use \(pinned: \[0, 1\]\)"):
                await asyncio.wait_for(shards.__anext__(), 3)
            for lease in held:
                lease.release()


async def test_a_failed_shard_raises_at_its_position(dataset: Dataset, tmp_path: Path, options: StorageOptions) -> None:
    root, index = dataset
    remote = tmp_path / "r2"
    shutil.copytree(root, remote)
    os.unlink(remote / "shard.00002.mds.zstd")
    got = []
    with LoopbackServer(str(remote)) as srv:
        async with ShardEngine(index, str(tmp_path / "c"), srv.url, options=options) as engine:

            async def consume() -> None:
                async with Prefetcher(engine, [0, 1, 2, 3]) as shards:
                    async for lease in shards:
                        got.append(lease.shard)
                        lease.release()

            with pytest.raises(RemoteNotFoundError, match=r"shard\.00002"):
                await consume()
            assert engine.cache.pinned == []
    assert got == [0, 1]
    assert temporaries(tmp_path / "c") == []


async def test_closing_cancels_transfers_and_leaves_no_temporaries(
    server: LoopbackServer, dataset: Dataset, tmp_path: Path, options: StorageOptions, monkeypatch: pytest.MonkeyPatch
) -> None:
    import astream._storage.sink as sink

    monkeypatch.setattr(sink, "FLUSH_BYTES", 1024)  # write to disk early, so there are temporaries
    _, index = dataset
    server.add(Fault("stall", match="*.zstd", after=4000, seconds=5, times=None))
    local = tmp_path / "c"
    async with ShardEngine(index, str(local), server.url, options=options, initial_concurrency=None) as engine:
        start = time.monotonic()
        async with Prefetcher(engine, [0, 1, 2, 3]):
            await wait_for(lambda: len(temporaries(local)) >= 2)
        assert time.monotonic() - start < 2
        assert temporaries(local) == []
        assert engine.cache.pinned == []
        assert engine.stats.cache_bytes == 0


async def test_a_cancelled_consumer_cleans_up(server: LoopbackServer, dataset: Dataset, tmp_path: Path, options: StorageOptions) -> None:
    _, index = dataset
    server.add(Fault("delay", match="*.zstd", seconds=5, times=None))
    local = tmp_path / "c"
    async with ShardEngine(index, str(local), server.url, options=options) as engine:

        async def consume() -> None:
            async with Prefetcher(engine, [0, 1, 2, 3]) as shards:
                async for lease in shards:
                    lease.release()

        task = asyncio.ensure_future(consume())
        await wait_for(lambda: server.count("*.zstd") >= 1)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
        assert engine.cache.pinned == []
        assert engine.stats.cache_bytes == 0
    assert tree(local) == []


async def test_throttling_lowers_concurrency(server: LoopbackServer, dataset: Dataset, tmp_path: Path, options: StorageOptions) -> None:
    _, index = dataset
    server.add(Fault("status", match="*.zstd", status=503, times=4))
    async with ShardEngine(
        index, str(tmp_path / "c"), server.url, options=options, max_concurrency=8, initial_concurrency=None
    ) as engine:
        async with Prefetcher(engine, [0, 1, 2, 3]) as shards:
            async for lease in shards:
                lease.release()
        stats = engine.stats
        assert stats.throttled == 4
        assert stats.retries == 4
        assert 1 <= stats.concurrency < 8
        assert stats.shards_downloaded == 4


def test_plan_is_checked(dataset: Dataset, tmp_path: Path) -> None:
    engine = ShardEngine(dataset[1], str(tmp_path), "http://127.0.0.1:9/")
    with pytest.raises(ConfigError, match="outside"):
        Prefetcher(engine, [0, 9])
    with pytest.raises(ConfigError, match="predownload"):
        Prefetcher(engine, [0], predownload=-1)


async def test_slow_start_fetches_the_first_shard_alone(
    server: LoopbackServer, dataset: Dataset, tmp_path: Path, options: StorageOptions
) -> None:
    _, index = dataset
    server.add(Fault("delay", match="*.zstd", seconds=0.1, times=None))
    async with ShardEngine(index, str(tmp_path / "c"), server.url, options=options, max_concurrency=4) as engine:
        assert engine.stats.concurrency == 1
        async with Prefetcher(engine, [0, 1, 2, 3]) as shards:
            async for lease in shards:
                lease.release()
        assert engine.stats.concurrency == 4
    first = [r.path for r in server.log][:2]
    assert first == ["shard.00000.mds.zstd", "shard.00001.mds.zstd"]
