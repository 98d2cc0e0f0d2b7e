"""ds.stats() / loader.stats(): one public snapshot of the node's and the consumer's figures."""

from __future__ import annotations

import asyncio
from pathlib import Path

import numpy as np
import pytest

from astream import Loader, MDSWriter, Stats, StreamingDataset
from astream.testing import LoopbackServer

N = 40


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("remote")
    with MDSWriter(out=str(root / "ds"), columns={"id": "int64", "x": "ndarray:uint8:100"}, size_limit="1kb") as w:
        for i in range(N):
            w.write({"id": i, "x": np.full(100, i % 256, np.uint8)})
    with LoopbackServer(root) as server:
        yield server


def test_stats_count_a_cold_epoch(served: LoopbackServer, tmp_path: Path) -> None:
    ds = StreamingDataset(remote=f"{served.url}/ds", local=str(tmp_path / "cache"), batch_size=4)
    try:
        before = ds.stats()
        assert isinstance(before, Stats)
        assert before.shards_downloaded == 0
        loader = Loader(ds)
        assert sum(len(b["id"]) for b in loader) == N
        after = loader.stats()
        shards = len(ds.indexes[0].shards)
        assert after.shards_downloaded == shards
        assert after.misses == shards
        assert after.bytes_downloaded == sum(s.raw_data.bytes for s in ds.indexes[0].shards)
        assert (after.batches, after.samples) == (N // 4, N)
        assert after.consumer_wait_s >= 0.0
        assert after.node["epoch"] >= 0
        assert after.as_dict()["samples"] == N
        # A second, warm epoch: hits, no new downloads; the loader's counters add up.
        assert sum(len(b["id"]) for b in loader) == N
        warm = loader.stats()
        assert warm.shards_downloaded == shards
        assert warm.hits >= shards
        assert 0.0 < warm.hit_rate < 1.0
        assert warm.samples == 2 * N
    finally:
        ds.close()


def test_async_stats(served: LoopbackServer, tmp_path: Path) -> None:
    ds = StreamingDataset(remote=f"{served.url}/ds", local=str(tmp_path / "cache"), batch_size=8)
    loader = Loader(ds)

    async def run() -> Stats:
        async for _ in loader:
            pass
        stats = await loader.astats()
        assert (await ds.astats()).shards_downloaded == stats.shards_downloaded
        await ds.aclose()
        return stats

    stats = asyncio.run(run())
    assert stats.samples == N
    assert stats.batches == N // 8
