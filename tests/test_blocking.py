"""The blocking-callback detector the engine, coordination and dataset tests run under."""

from __future__ import annotations

import asyncio
import time

from blocking import DEBUG_LOG, LIMIT, debug_loop, detect_blocking


def _burn(seconds: float) -> None:
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def test_a_callback_that_burns_the_loop_is_caught() -> None:
    loop = debug_loop(asyncio.new_event_loop)()
    try:
        assert loop.get_debug()
        assert loop.slow_callback_duration == DEBUG_LOG
        with detect_blocking() as found:
            loop.run_until_complete(asyncio.sleep(0))
            loop.call_soon(_burn, LIMIT * 2)
            loop.run_until_complete(asyncio.sleep(0.01))
        assert len(found) == 1
        assert found[0][0] > LIMIT
        assert "_burn" in found[0][1]
    finally:
        loop.close()


def test_waiting_is_not_blocking() -> None:
    async def main() -> None:
        await asyncio.sleep(0.2)  # the loop idles: no callback runs long
        await asyncio.to_thread(_burn, LIMIT * 2)  # CPU in another thread is fine

    with detect_blocking() as found:
        asyncio.run(main())
    assert found == []


def test_a_first_import_is_not_counted() -> None:
    import sys

    def import_then_burn() -> None:
        sys.modules.pop("colorsys", None)
        import colorsys  # noqa: F401  # a module load: a one-time cost

        _burn(LIMIT * 2)

    loop = asyncio.new_event_loop()
    try:
        with detect_blocking() as found:
            loop.call_soon(import_then_burn)
            loop.run_until_complete(asyncio.sleep(0.01))
        assert found == []
    finally:
        loop.close()


def test_a_garbage_collection_is_not_counted() -> None:
    import gc

    def collect_a_lot() -> None:
        junk = [[i] for i in range(300_000)]
        for _ in range(20):
            gc.collect()  # a collection's CPU time: the process's, not this callback's doing
        del junk

    loop = asyncio.new_event_loop()
    try:
        with detect_blocking() as found:
            loop.call_soon(collect_a_lot)
            loop.run_until_complete(asyncio.sleep(0.01))
        assert found == []
    finally:
        loop.close()
