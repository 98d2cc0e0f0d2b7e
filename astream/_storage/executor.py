"""A thread pool that runs the most urgent job first.

The cache's file work (decompress, hash, write) competes for a few threads. Jobs of the
shard the consumer needs next must not queue behind jobs of shards it needs later, or
the time to the first ready shard grows with the number of transfers in flight. Jobs
carry a priority (lower runs first; plain ``submit`` is the most urgent) and run in
priority order, FIFO within one priority.
"""

from __future__ import annotations

import itertools
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import Any, TypeVar

from astream.errors import UsageError

__all__ = ["PriorityExecutor"]

T = TypeVar("T")
_STOP = float("inf")


class PriorityExecutor(Executor):
    """``concurrent.futures.Executor`` whose queue is ordered by :meth:`submit_priority`'s key."""

    def __init__(self, max_workers: int, name: str = "astream-io") -> None:
        if max_workers < 1:
            raise UsageError("max_workers must be at least 1")
        self._max_workers = max_workers
        self._name = name
        self._queue: queue.PriorityQueue[tuple[float, int, Any]] = queue.PriorityQueue()
        self._seq = itertools.count()
        self._threads: list[threading.Thread] = []
        self._idle = 0
        self._lock = threading.Lock()
        self._shutdown = False

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        return self.submit_priority(0, fn, *args, **kwargs)

    def submit_priority(self, priority: float, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:
        """Queue ``fn(*args, **kwargs)``; among queued jobs the lowest ``priority`` runs first."""
        future: Future[T] = Future()
        with self._lock:
            if self._shutdown:
                raise RuntimeError("cannot schedule new futures after shutdown")
            self._queue.put((priority, next(self._seq), (future, fn, args, kwargs)))
            if self._idle == 0 and len(self._threads) < self._max_workers:
                thread = threading.Thread(target=self._work, name=f"{self._name}-{len(self._threads)}", daemon=True)
                self._threads.append(thread)
                thread.start()
            else:
                self._idle = max(0, self._idle - 1)
        return future

    def _work(self) -> None:
        while True:
            priority, _, item = self._queue.get()
            if priority == _STOP:
                return
            future, fn, args, kwargs = item
            if future.set_running_or_notify_cancel():
                try:
                    result = fn(*args, **kwargs)
                except BaseException as exc:
                    future.set_exception(exc)
                else:
                    future.set_result(result)
            del future, fn, args, kwargs, item
            with self._lock:
                self._idle += 1

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        with self._lock:
            if self._shutdown:
                threads: list[threading.Thread] = []
            else:
                self._shutdown = True
                threads = list(self._threads)
            if cancel_futures:
                while True:
                    try:
                        _, _, item = self._queue.get_nowait()
                    except queue.Empty:
                        break
                    if item is not None:
                        item[0].cancel()
            for _ in threads:
                self._queue.put((_STOP, next(self._seq), None))
        if wait:
            for thread in threads:
                thread.join()
