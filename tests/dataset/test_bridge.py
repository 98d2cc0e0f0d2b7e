from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager

import pytest

from astream._dataset.bridge import SyncIterator
from astream._storage.loop import LoopThread
from astream.errors import UsageError


@pytest.fixture
def portal():
    p = LoopThread()
    yield p
    p.close()


def _source(n: int, log: list[str], fail_at: int | None = None):
    @asynccontextmanager
    async def open_iterator() -> AsyncIterator[AsyncIterator[int]]:
        log.append("enter")

        async def gen() -> AsyncIterator[int]:
            for i in range(n):
                if i == fail_at:
                    raise ValueError(f"boom at {i}")
                await asyncio.sleep(0)
                log.append(f"made {i}")
                yield i

        it = gen()
        try:
            yield it
        finally:
            await it.aclose()
            log.append("exit")

    return open_iterator


def test_items_arrive_in_order_and_resources_close(portal: LoopThread) -> None:
    log: list[str] = []
    with SyncIterator(portal, _source(10, log), maxsize=3) as it:
        assert list(it) == list(range(10))
    assert log[0] == "enter"
    assert log[-1] == "exit"


def test_prefetch_is_bounded(portal: LoopThread) -> None:
    log: list[str] = []
    it = SyncIterator(portal, _source(100, log), maxsize=3)
    assert next(it) == 0
    time.sleep(0.2)  # give the pump every chance to run ahead
    made = sum(1 for e in log if e.startswith("made"))
    # one handed out, at most 3 waiting, plus the one blocked on a slot
    assert made <= 5
    it.close()
    assert log[-1] == "exit"


def test_error_in_async_iterator_surfaces_with_its_type(portal: LoopThread) -> None:
    log: list[str] = []
    it = SyncIterator(portal, _source(10, log, fail_at=4), maxsize=2)
    got = [next(it) for _ in range(4)]
    assert got == [0, 1, 2, 3]
    with pytest.raises(ValueError, match="boom at 4"):
        next(it)
    assert list(it) == []


def test_close_midway_cancels_and_is_idempotent(portal: LoopThread) -> None:
    log: list[str] = []
    it = SyncIterator(portal, _source(1000, log), maxsize=2)
    next(it)
    it.close()
    it.close()
    assert log[-1] == "exit"
    with pytest.raises(StopIteration):
        next(it)


def test_sync_call_from_the_loop_thread_is_refused(portal: LoopThread) -> None:
    async def inner() -> int:
        return 1

    async def outer() -> None:
        portal.call(inner())

    with pytest.raises(UsageError, match="own event loop"):
        portal.call(outer())
