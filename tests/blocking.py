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
its reach, and so are callbacks that imported a module, a one-time cost; ``ASYNC`` lint
rules catch sync sleeps and I/O in the source.)
"""

from __future__ import annotations

import asyncio.events
import sys
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
    start, modules = time.thread_time(), len(sys.modules)
    try:
        _original_run(self)
    finally:
        spent = time.thread_time() - start
        # A first import (compiling a fresh clone's modules, loading a lazy dependency) is
        # paid once per process, not per batch: not what this detector is for.
        if spent > LIMIT and len(sys.modules) == modules:
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
