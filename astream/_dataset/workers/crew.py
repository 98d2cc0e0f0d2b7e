"""A loader's worker processes, kept from one epoch to the next (persistent workers).

Starting a worker process costs a fork of the forkserver, unpickling its job, an event
loop and its pipes; per epoch, with two workers, that was most of an epoch of 1,000
samples of 100 KB. A :class:`Crew` keeps the processes of an epoch that ended cleanly
(every worker's last message, "end", read: its pipes are at a message boundary) and
lends them to the next epoch's :class:`~astream._dataset.workers.pool.WorkerPool`, which
sends each its new job (the epoch, the resume point and the dataset's state, pickled:
the plan is computed in the worker from them, as for a new process) over its control
pipe. An epoch that stops early, fails or loses a worker leaves nothing to reuse: its
processes are terminated and the next epoch starts new ones.

One owner: the crew holds the processes between epochs, a pool while it runs. The
loader closes the crew (``close()``, ``with``, or a finalizer when it is collected:
processes and descriptors are released by that close, not by the collector of their
objects).
"""

from __future__ import annotations

import threading
from collections.abc import Sequence

from astream._dataset.workers.spawn import ProcessWorker

__all__ = ["Crew"]


class Crew:
    """The worker processes a loader keeps between epochs."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._workers: list[ProcessWorker] = []
        # The pool's "stopping" of the workers given back: their reader threads may still be
        # finishing their epoch (a worker still starting when the stand-ins served it all).
        self._stopping: threading.Event | None = None
        self._busy = False
        self._discard = False  # closed while a pool held the workers: that pool closes them

    def acquire(self, num_workers: int) -> tuple[bool, list[ProcessWorker] | None]:
        """Lend the crew to a pool: (whether the pool may keep its workers, the running ones).

        ``(False, None)``: another iteration of the loader holds it (its pool starts
        processes of its own and closes them). ``(True, None)``: no running workers to
        reuse; the pool starts new ones and gives them back.
        """
        with self._lock:
            if self._busy:
                return False, None
            self._busy, self._discard = True, False
            workers, self._workers = self._workers, []
            stopping, self._stopping = self._stopping, None
        _settle(workers, stopping)
        if len(workers) == num_workers and all(w.clean and w.proc.is_alive() for w in workers):
            return True, workers
        _close(workers)
        return True, None

    def settle(self) -> None:
        """Wait (bounded) for kept workers still finishing their last epoch. Blocking: not on a
        loop that those workers' reader threads need (the stand-ins' hand-off runs there)."""
        with self._lock:
            workers, stopping, self._stopping = list(self._workers), self._stopping, None
        _settle(workers, stopping)

    def give_back(self, workers: Sequence[ProcessWorker], stopping: threading.Event | None = None) -> bool:
        """The pool is done with them; False: keep nothing (the crew was closed), close them.

        With ``stopping`` (the pool's), their reader threads may still be reading the
        epoch's last word: the next :meth:`acquire` waits for them (bounded), not the
        epoch's end.
        """
        with self._lock:
            self._busy = False
            if self._discard:
                return False
            self._workers = list(workers)
            self._stopping = stopping
            return True

    def close(self) -> None:
        """Stop the kept processes and close their pipes (a running pool closes its own). Idempotent."""
        with self._lock:
            if self._busy:
                self._discard = True
            workers, self._workers = self._workers, []
            stopping, self._stopping = self._stopping, None
        if stopping is not None:
            stopping.set()
        _close(workers)


# Seconds the next epoch waits at most for a kept worker that was still starting.
_SETTLE_WAIT = 10.0


def _settle(workers: Sequence[ProcessWorker], stopping: threading.Event | None) -> None:
    """Wait for the reader threads of workers given back while still finishing, then stop them."""
    if stopping is None:
        return
    for worker in workers:
        if worker.thread is not None:
            worker.thread.join(timeout=_SETTLE_WAIT)
    stopping.set()  # a thread still waiting now belongs to a worker that will not be reused


def _close(workers: Sequence[ProcessWorker]) -> None:
    for worker in workers:
        worker.terminate()
    for worker in workers:
        worker.join()
        worker.close()
