"""The engine's part in a bounded cache: next-use eviction, prefetch reservations, cancels."""

from __future__ import annotations

import asyncio
import math
import os
from pathlib import Path

from cachekit import temporaries

from astream._cache import ShardEngine
from astream._format.index import Index
from astream._storage import StorageOptions
from astream.testing import LoopbackServer

BOTH_LOOPS = True

Dataset = tuple[Path, Index]


async def test_a_transfer_cancelled_before_it_ran_releases_its_reservation(
    server: LoopbackServer, dataset: Dataset, tmp_path: Path, options: StorageOptions
) -> None:
    _, index = dataset
    async with ShardEngine(index, str(tmp_path / "cache"), server.url, options=options) as engine:
        await engine.reserve(0)
        assert engine.cache.used > 0
        engine.unpin(0)  # at once: the install task has not run a step
        await engine.settle([0])
        assert engine.cache.used == 0
        assert engine.is_absent(0)
        assert engine.stats.cancelled == 1
        # and a later request of it starts afresh and completes
        path = await engine.ensure(0)
        assert os.path.getsize(path) == index.shards[0].raw_data.bytes  # noqa: ASYNC240 - a test, one stat
        engine.unpin(0)
    assert temporaries(tmp_path / "cache") == []


async def test_a_request_for_a_shard_being_cancelled_waits_for_it_and_fetches_again(
    server: LoopbackServer, dataset: Dataset, tmp_path: Path, options: StorageOptions
) -> None:
    _, index = dataset
    async with ShardEngine(index, str(tmp_path / "cache"), server.url, options=options) as engine:
        await engine.reserve(1)
        await asyncio.sleep(0)  # the transfer is under way
        engine.unpin(1)  # cancelled, not yet wound up
        path = await asyncio.wait_for(engine.ensure(1), 10)
        assert os.path.getsize(path) == index.shards[1].raw_data.bytes  # noqa: ASYNC240 - a test, one stat
        engine.unpin(1)


async def test_room_goes_to_the_farthest_next_use_and_a_prefetch_only_takes_what_belady_would(
    server: LoopbackServer, dataset: Dataset, tmp_path: Path, options: StorageOptions
) -> None:
    _, index = dataset
    sizes = [s.raw_data.bytes for s in index.shards]
    limit = 2 * max(sizes)  # room for two shards, not three
    assert sum(sorted(sizes)[:3]) > limit
    async with ShardEngine(index, str(tmp_path / "cache"), server.url, options=options, cache_limit=limit,
                           pinned_at_once=1) as engine:
        for i in (0, 1):
            await engine.ensure(i)
            engine.unpin(i)
        distance = {0: 5.0, 1: math.inf, 2: 0.0, 3: 3.0}
        await engine.reserve(2, next_use=distance.__getitem__)
        await engine.wait_ready(2)
        assert engine.is_absent(1)  # never read again: it went, not 0
        assert engine.is_ready(0)
        engine.unpin(2)
        # a prefetch of 3 (read 3 ahead): Belady would drop 0 (read after 3), so it may
        assert engine.try_reserve(3, lambda i: {0: 2.0, 2: 0.0}.get(i, math.inf), lambda i: False)
        await engine.wait_ready(3)
        assert engine.is_absent(0)
        engine.unpin(3)
        # a prefetch whose Belady victim is read before it: no room yet, nothing pinned
        assert not engine.try_reserve(0, lambda i: math.inf if i == 2 else 1.0, lambda i: i == 2)
        assert engine.is_absent(0)
        assert engine.cache.pinned == []
        assert engine.stats.evictions == 2
        assert engine.stats.prefetches == 1
