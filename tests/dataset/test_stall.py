"""Stall figures (issue #20): waits of next(), readiness, per-stage times, the progress bar."""

from __future__ import annotations

import asyncio
import re
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from astream import Loader, MDSWriter, StreamingDataset
from astream._dataset.observe.timings import BUCKETS_S, STAGES, StageTimes, WaitHistogram
from astream.errors import ConfigError
from astream.testing import LoopbackServer

N = 48
SLEEP = 0.003


def slow_transform(batch: Any) -> Any:
    time.sleep(SLEEP)  # each batch costs at least this; waits and stage times must show it
    return batch


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("remote")
    with MDSWriter(out=str(root / "ds"), columns={"id": "int64", "x": "ndarray:uint8:100"}, size_limit="1kb",
                   compression="zstd") as w:
        for i in range(N):
            w.write({"id": i, "x": np.full(100, i % 256, np.uint8)})
    with LoopbackServer(root) as server:
        yield server


def test_histogram_quantiles_bound_each_wait_within_a_factor_two() -> None:
    h = WaitHistogram()
    waits = [1e-6 * 1.7**k for k in range(30)]  # 1 us .. about 5 s
    for w in waits:
        h.add(w)
    assert h.total == len(waits)
    assert sum(h.counts) == len(waits)
    assert h.sum_s == pytest.approx(sum(waits))
    for q in (0.01, 0.5, 0.9, 0.99, 1.0):
        exact = sorted(waits)[max(1, int(np.ceil(q * len(waits)))) - 1]
        assert exact <= h.quantile(q) < 2 * exact, q
    assert h.quantile(1.0) == max(waits)
    h.add(3600.0)  # beyond the last bound: the overflow bucket, capped by the largest wait
    assert h.counts[-1] == 1
    assert h.quantile(1.0) == 3600.0
    assert WaitHistogram().quantile(0.5) == 0.0
    assert len(BUCKETS_S) == 30
    assert BUCKETS_S[0] == 1e-6


def test_stage_times_report_what_was_added_since_the_last_report() -> None:
    mine, consumer = StageTimes(), StageTimes()
    mine.add("read", 0.5)
    mine.add("read", 0.25)
    consumer.merge(mine.take())
    assert mine.take() == {}
    mine.add("collate", 1.0, 3)
    consumer.merge(mine.take())
    snap = consumer.snapshot()
    assert snap["read"] == {"seconds": 0.75, "calls": 2}
    assert snap["collate"] == {"seconds": 1.0, "calls": 3}
    assert snap["transport"] == {"seconds": 0.0, "calls": 0}


def test_a_cold_epoch_counts_waits_stages_and_the_node(served: LoopbackServer, tmp_path: Path) -> None:
    ds = StreamingDataset(remote=f"{served.url}/ds", local=str(tmp_path / "cache"), batch_size=4)
    loader = Loader(ds, batch_transform=slow_transform)
    before = STAGES.snapshot()

    async def run() -> Any:
        async for _ in loader:
            pass
        stats = await loader.astats()
        await ds.aclose()
        return stats

    stats = asyncio.run(run())
    batches = N // 4
    shards = len(ds.indexes[0].shards)
    assert stats.batches == batches
    # no workers: each __anext__ reads and transforms its batch, so none is ready at once
    assert stats.readiness == 0.0
    assert sum(n for _, n in stats.wait_buckets) == batches
    assert all(bound >= SLEEP for bound, _ in stats.wait_buckets)
    assert stats.consumer_wait_s >= batches * SLEEP
    assert SLEEP <= stats.wait_p50_s <= stats.wait_p99_s <= stats.wait_max_s <= stats.consumer_wait_s
    assert 0.0 < stats.stall <= 1.0
    for stage in ("read", "transform"):
        assert stats.stages[stage]["calls"] - before[stage]["calls"] == batches, stage
    assert stats.stages["transform"]["seconds"] - before["transform"]["seconds"] >= batches * SLEEP
    # the node's side: every shard fetched once, its transfer and decoding timed
    assert stats.shards_downloaded == shards
    assert stats.requests == stats.hits + stats.misses >= shards
    assert stats.redownloads == 0
    assert stats.evictions == 0
    assert stats.retries == 0
    assert stats.throttled == 0
    assert stats.stages["download"]["calls"] == stats.stages["decode"]["calls"] == shards
    assert stats.download_s > 0.0
    assert stats.decode_s > 0.0
    assert stats.peak_cache_bytes >= sum(s.raw_data.bytes for s in ds.indexes[0].shards)


def test_worker_processes_report_their_stage_times(served: LoopbackServer, tmp_path: Path) -> None:
    ds = StreamingDataset(remote=f"{served.url}/ds", local=str(tmp_path / "cache"), batch_size=2)
    before = STAGES.snapshot()
    with Loader(ds, num_workers=2, batch_transform=slow_transform) as loader:
        # the second epoch runs in the worker processes kept from the first (no stand-ins)
        for _ in range(2):
            assert sum(len(b["id"]) for b in loader) == N
        stats = loader.stats()
    ds.close()
    batches = 2 * N // 2
    # read in the workers (or by the consumer standing in for them while they start): all
    # of them reach this process's figures, none twice
    assert stats.stages["transform"]["calls"] - before["transform"]["calls"] == batches
    assert stats.stages["read"]["calls"] - before["read"]["calls"] == batches
    carried = stats.stages["transport"]["calls"] - before["transport"]["calls"]
    assert N // 2 <= carried <= batches
    assert stats.stages["transport"]["seconds"] > before["transport"]["seconds"]
    assert stats.batches == batches
    assert 0.0 <= stats.readiness <= 1.0


def test_progress_bar_shows_samples_and_stall(served: LoopbackServer, tmp_path: Path,
                                              capsys: pytest.CaptureFixture[str]) -> None:
    ds = StreamingDataset(remote=f"{served.url}/ds", local=str(tmp_path / "cache"), batch_size=4)
    loader = Loader(ds, progress=True)
    assert sum(len(b["id"]) for b in loader) == N
    ds.close()
    err = capsys.readouterr().err
    assert re.search(rf"100%.*\b{N}(\.0)?/{N}(\.0)? .*sample/s", err), err
    assert "stall " in err
    assert "ready " in err

    async def run() -> int:
        ds2 = StreamingDataset(remote=f"{served.url}/ds", local=str(tmp_path / "cache"), batch_size=4)
        n = 0
        async for batch in Loader(ds2, progress=True):
            n += len(batch["id"])
            if n >= N // 2:
                break  # the bar closes with the iteration
        await ds2.aclose()
        return n

    assert asyncio.run(run()) == N // 2
    err = capsys.readouterr().err
    assert re.search(rf"\b{N // 2}(\.0)?/{N}(\.0)? .*stall \d+%, ready \d+%", err), err
    with pytest.raises(ConfigError, match="progress must be True or False"):
        Loader(ds, progress="yes")  # type: ignore[arg-type]
