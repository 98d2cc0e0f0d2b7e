from __future__ import annotations

import asyncio
import os

import pytest
from worker_jobs import RangeJob

from astream._dataset.workers.pool import WorkerPool
from astream.errors import ConfigError, WorkerError

MODES = ["process", "thread"]


async def _collect(job: RangeJob, n: int, mode: str) -> list[dict]:
    async with WorkerPool(job, n, mode, prefetch=2, loop_factory=asyncio.new_event_loop) as pool:
        return [b async for b in pool.batches()]


@pytest.mark.parametrize("mode", MODES)
async def test_round_robin_order_skips_finished_workers(mode: str) -> None:
    batches = await _collect(RangeJob((3, 1, 2)), 3, mode)
    firsts = [int(b["x"][0, 0]) for b in batches]
    assert firsts == [0, 100, 200, 1, 201, 2]
    pids = {int(b["pid"][0]) for b in batches}
    if mode == "process":
        assert os.getpid() not in pids
        assert len(pids) == 3
    else:
        assert pids == {os.getpid()}


@pytest.mark.parametrize("mode", MODES)
async def test_worker_exception_surfaces_with_traceback(mode: str) -> None:
    with pytest.raises(WorkerError, match="bad shard in worker 1") as info:
        await _collect(RangeJob((5, 5), fail_worker=1, fail_after=2), 2, mode)
    assert "worker traceback" in str(info.value)
    assert "ValueError" in str(info.value)


async def test_killed_worker_surfaces_instead_of_hanging() -> None:
    with pytest.raises(WorkerError, match=r"died without a word \(exit code -9\)"):
        await asyncio.wait_for(_collect(RangeJob((50, 50), die_worker=0, fail_after=3), 2, "process"), 60)


async def test_batch_that_cannot_be_unpickled_surfaces_instead_of_hanging() -> None:
    # Its reader thread used to die with the unpickling's error, and the consumer waited
    # for that worker's next batch forever.
    with pytest.raises(WorkerError, match=r"worker 1 .*could not be received: ValueError\('this object cannot"):
        await asyncio.wait_for(_collect(RangeJob((20, 20), refused_worker=1, fail_after=3), 2, "process"), 60)


@pytest.mark.parametrize("mode", MODES)
async def test_early_close_stops_workers(mode: str) -> None:
    pool = WorkerPool(RangeJob((10_000, 10_000)), 2, mode, prefetch=2, loop_factory=asyncio.new_event_loop)
    async with pool:
        got = 0
        async for _ in pool.batches():
            got += 1
            if got == 5:
                break
    for worker in pool._processes:
        assert not worker.proc.is_alive()
    for thread in [*pool._threads, *(w.thread for w in pool._processes if w.thread is not None)]:
        assert not thread.is_alive()


def test_bad_arguments() -> None:
    with pytest.raises(ConfigError, match="worker_mode"):
        WorkerPool(RangeJob((1,)), 1, "fiber", 2, asyncio.new_event_loop)
    with pytest.raises(ConfigError, match="num_workers"):
        WorkerPool(RangeJob((1,)), 0, "thread", 2, asyncio.new_event_loop)


async def test_close_finishes_even_when_cancelled_midway() -> None:
    """A consumer that stops while the pool is closing (after its last batch) leaves nothing open."""
    pool = WorkerPool(RangeJob((3, 3)), 2, "process", prefetch=2, loop_factory=asyncio.new_event_loop)
    async with pool:
        assert len([b async for b in pool.batches()]) == 6
        closing = asyncio.ensure_future(pool.aclose())
        await asyncio.sleep(0)  # it is now waiting for the reader threads
        closing.cancel()
        with pytest.raises(asyncio.CancelledError):
            await closing
    assert all(worker.conn.closed for worker in pool._processes)
    assert all(worker.channel.fileno() == -1 for worker in pool._processes if worker.channel is not None)
    for worker in pool._processes:
        assert not worker.proc.is_alive()
