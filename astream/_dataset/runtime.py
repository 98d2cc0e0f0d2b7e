"""Per-process runtime: the loop thread that serves synchronous calls.

Created lazily in the process that needs it (datasets hold configuration only, so a
dataset pickled into a spawned worker starts clean), and recreated if the process
id changed — a user who forks anyway gets a fresh loop in the child instead of a
copy of one whose thread does not exist there.
"""

from __future__ import annotations

import atexit
import os
import threading
from collections.abc import Callable

from astream._storage.loop import LoopThread

__all__ = ["portal"]

_lock = threading.Lock()
_portal: LoopThread | None = None
_pid = 0


def portal() -> LoopThread:
    """This process's astream loop thread (started on first use)."""
    global _portal, _pid
    with _lock:
        if _portal is None or _pid != os.getpid():
            _portal = LoopThread(name="astream-sync")
            _pid = os.getpid()
        return _portal


def _close_portal() -> None:
    global _portal
    with _lock:
        if _portal is not None and _pid == os.getpid():
            _portal.close()
        _portal = None


def _at_exit(fn: Callable[[], None]) -> None:
    """Run ``fn`` as the interpreter exits, before its thread pools stop taking work where
    Python allows it: astream's loop then closes (its iterations cancelled, its clients
    gone) before an executor refuses a transfer or an agent's start half-way (work a
    program that took a batch and ended left going)."""
    register = getattr(threading, "_register_atexit", None)  # (what concurrent.futures uses, 3.9+)
    if register is None:  # pragma: no cover - another Python
        atexit.register(fn)
        return
    # Imported first, so its hook (which stops the pools) is registered before this one and
    # runs after it (the hooks run last registered first).
    import concurrent.futures.thread  # noqa: F401

    register(fn)


_at_exit(_close_portal)
