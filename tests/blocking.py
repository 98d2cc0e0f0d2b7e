"""A detector of callbacks that hold an asyncio loop's thread, for the engine, coordination
and dataset tests.

asyncio's debug mode (on in those tests, with ``slow_callback_duration`` at 50 ms) logs
every callback that ran longer than that, but by the wall clock: on the two shared cores
these tests run on, a callback that was only descheduled for a while is logged too, so
its log is a hint, not a verdict. The verdict is this detector's: every ``Handle`` run
is timed by its thread's CPU clock (what the loop itself spent, whatever the scheduler
did meanwhile), and a test fails when a callback of its loops spent more than
``LIMIT`` seconds there: decompression, hashing or parsing on the loop instead of in
an executor. (Blocking waits that spend no CPU, such as a sync ``time.sleep``, are out of
its reach; ``ASYNC`` lint rules catch those in the source.)
"""

from __future__ import annotations

import asyncio.events
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

LIMIT = 0.05

_lock = threading.Lock()
_seen: list[tuple[float, str]] = []
_original_run = asyncio.events.Handle._run


def _timed_run(self: asyncio.events.Handle) -> None:
    start = time.thread_time()
    try:
        _original_run(self)
    finally:
        spent = time.thread_time() - start
        if spent > LIMIT:
            with _lock:
                _seen.append((spent, repr(self)))


@contextmanager
def detect_blocking() -> Iterator[list[tuple[float, str]]]:
    """Time every asyncio callback inside the block; yields what exceeded ``LIMIT``."""
    with _lock:
        _seen.clear()
    asyncio.events.Handle._run = _timed_run  # type: ignore[method-assign]
    try:
        found: list[tuple[float, str]] = []
        yield found
    finally:
        asyncio.events.Handle._run = _original_run  # type: ignore[method-assign]
        with _lock:
            found.extend(_seen)
            _seen.clear()


def debug_loop(factory: Any) -> Any:
    """``factory`` with asyncio's debug mode on and a 50 ms slow-callback threshold."""

    def make() -> asyncio.AbstractEventLoop:
        loop = factory()
        loop.set_debug(True)
        loop.slow_callback_duration = LIMIT
        return loop  # type: ignore[no-any-return]

    return make
