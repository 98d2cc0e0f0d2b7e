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


@atexit.register
def _close_portal() -> None:
    global _portal
    with _lock:
        if _portal is not None and _pid == os.getpid():
            _portal.close()
        _portal = None
