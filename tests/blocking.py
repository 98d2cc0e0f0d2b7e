"""A detector of callbacks that hold an asyncio loop's thread, for the engine, coordination
and dataset tests.

asyncio's debug mode (on in those tests, with ``slow_callback_duration`` at 50 ms,
``DEBUG_LOG``) logs every callback that ran longer than that, but by the wall clock: on the
two shared cores these tests run on, a callback that was only descheduled is logged too,
so its log is a hint, not a verdict. The verdict is this detector's: every ``Handle`` run
is timed by its thread's CPU clock (what the loop itself spent, whatever the scheduler did
meanwhile), and a test fails when a callback spent more than ``LIMIT`` there: decompression,
hashing or parsing on the loop instead of in an executor. ``LIMIT`` is above the debug
log's 50 ms because a virtual machine's CPU clock runs on while the hypervisor steals the
core: with five test runs sharing two cores, callbacks that take ~10 ms alone were
measured at 58 and 100 CPU ms. (Blocking waits that spend no CPU, such as a sync
``time.sleep``, are out of its reach, and so are callbacks that imported a module, a
one-time cost; ``ASYNC`` lint rules catch sync sleeps and I/O in the source.)
"""

from __future__ import annotations

import asyncio.events
import gc
import sys
import threading
import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

DEBUG_LOG = 0.05  # asyncio's slow-callback log
LIMIT = 0.25  # the verdict, in CPU seconds of the loop's thread

_lock = threading.Lock()
_seen: list[tuple[float, str]] = []
_original_run = asyncio.events.Handle._run


_gc = threading.local()  # per thread: CPU seconds spent in garbage collections so far


def _gc_phase(phase: str, info: dict[str, Any]) -> None:
    # A collection runs in whichever callback allocated last, and in a test process of
    # thousands of tests a full one costs a few hundred CPU ms: not the callback's doing.
    now = time.thread_time()
    if phase == "start":
        _gc.started = now
    elif getattr(_gc, "started", None) is not None:
        _gc.spent = getattr(_gc, "spent", 0.0) + now - _gc.started
        _gc.started = None


def _timed_run(self: asyncio.events.Handle) -> None:
    start, modules, collecting = time.thread_time(), len(sys.modules), getattr(_gc, "spent", 0.0)
    try:
        _original_run(self)
    finally:
        spent = time.thread_time() - start - (getattr(_gc, "spent", 0.0) - collecting)
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
    gc.callbacks.append(_gc_phase)
    try:
        found: list[tuple[float, str]] = []
        yield found
    finally:
        gc.callbacks.remove(_gc_phase)
        asyncio.events.Handle._run = _original_run  # type: ignore[method-assign]
        with _lock:
            found.extend(_seen)
            _seen.clear()


def debug_loop(factory: Any) -> Any:
    """``factory`` with asyncio's debug mode on and a 50 ms slow-callback log."""

    def make() -> asyncio.AbstractEventLoop:
        loop = factory()
        loop.set_debug(True)
        loop.slow_callback_duration = DEBUG_LOG
        return loop  # type: ignore[no-any-return]

    return make
