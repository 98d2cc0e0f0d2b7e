from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from typing import Any

import numpy as np
import pytest

from astream._dataset.bridge import SyncIterator
from astream._dataset.depth import MAX_DEPTH, QUEUE_BYTES
from astream._storage.loop import LoopThread
from astream.errors import UsageError


@pytest.fixture
def portal():
    p = LoopThread()
    yield p
    p.close()


def _source(n: int, log: list[str], fail_at: int | None = None, item_bytes: int = 0):
    @asynccontextmanager
    async def open_iterator() -> AsyncIterator[AsyncIterator[Any]]:
        log.append("enter")

        async def gen() -> AsyncIterator[Any]:
            for i in range(n):
                if i == fail_at:
                    raise ValueError(f"boom at {i}")
                await asyncio.sleep(0)
                log.append(f"made {i}")
                yield np.full(item_bytes, i % 256, dtype=np.uint8) if item_bytes else i

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


@pytest.mark.parametrize(("item_bytes", "depth"), [
    (QUEUE_BYTES // 2, 3),  # big items: the depth asked for
    (QUEUE_BYTES // 10, 10),  # smaller ones: as many as fit in QUEUE_BYTES
    (0, MAX_DEPTH),  # tiny ones: never deeper than MAX_DEPTH
])
def test_prefetch_is_bounded(portal: LoopThread, item_bytes: int, depth: int) -> None:
    log: list[str] = []
    it = SyncIterator(portal, _source(200, log, item_bytes=item_bytes), maxsize=3)
    next(it)
    time.sleep(0.3)  # give the pump every chance to run ahead
    made = sum(1 for e in log if e.startswith("made"))
    # one handed out, at most `depth` waiting, plus the one blocked on a slot
    assert depth <= made <= depth + 2
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


def test_close_wakes_a_thread_waiting_for_the_next_item(portal: LoopThread) -> None:
    """Another thread (tf.data's, say) blocked in next() ends when the iterator is closed."""
    import threading

    @asynccontextmanager
    async def never() -> AsyncIterator[AsyncIterator[int]]:
        async def gen() -> AsyncIterator[int]:
            await asyncio.sleep(3600)
            yield 0

        yield gen()

    it: SyncIterator[int] = SyncIterator(portal, never, maxsize=2)
    outcome: list[str] = []

    def consume() -> None:
        try:
            next(it)
        except StopIteration:
            outcome.append("stopped")

    waiter = threading.Thread(target=consume)
    waiter.start()
    time.sleep(0.1)
    it.close()
    waiter.join(5)
    assert outcome == ["stopped"]


def test_batch_nbytes_counts_columns_of_strings_and_mixed_lists() -> None:
    import numpy as np

    from astream._dataset.depth import batch_nbytes

    assert batch_nbytes({"s": ["ab", "cde"], "b": [b"x" * 10, b""], "n": np.zeros(4, np.int64)}) == 5 + 10 + 32
    assert batch_nbytes(["ab", None, "c"]) == 3 + batch_nbytes(None)  # a null: each value on its own
    assert batch_nbytes([np.zeros(2, np.float32), "abc"]) == 8 + 3
