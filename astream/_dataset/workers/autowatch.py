"""What the first epoch of a ``num_workers="auto"`` loader costs, noted as its batches are handed out.

No extra work: at each batch the consumer receives, the process's CPU time
(``time.process_time``, every thread) and the consumer thread's (``time.thread_time``)
are read. What the process spent beside the consumer's own code — reading, decoding,
``transform`` in executor threads, collation, ``batch_transform``: what workers would
take over — is the batch's production cost; the consumer's time between two batches,
less what it waited, its step. (An ``async for`` consumer shares its thread with the
reader: the CPU its thread spent while it waited for a batch counts as production.)
The choice itself is :func:`astream._dataset.workers.autoworkers.choose_workers`.
"""

from __future__ import annotations

import statistics
import threading
import time
from typing import Any

import numpy as np

from astream._dataset.workers.autoworkers import OBSERVED, WorkerChoice, choose_workers, usable_cores

__all__ = ["CostWatch", "batch_bytes"]


def batch_bytes(batch: Any) -> int:
    """Bytes of a batch's arrays (a dict of columns, a sequence, or one array)."""
    if isinstance(batch, np.ndarray):
        return int(batch.nbytes)
    if isinstance(batch, dict):
        return sum(batch_bytes(v) for v in batch.values())
    if isinstance(batch, (list, tuple)):
        return sum(batch_bytes(v) for v in batch if isinstance(v, np.ndarray))
    return 0


class CostWatch:
    """The first epoch's production cost per batch, and its first :data:`OBSERVED` consumer steps.

    Production is summed from the epoch's start to its end and divided by the batches
    handed out: a read-ahead can make many batches before the consumer takes its first
    (a consumer descheduled on a loaded machine, a small epoch), and a per-interval
    median would then see those batches as free.
    """

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._produced = 0.0  # production CPU since the first epoch began
        self._batches = 0
        self._bytes: list[int] = []
        self._steps: list[float] = []
        # When the consumer received the previous batch (or the epoch began): wall, process CPU,
        # its thread's CPU.
        self._last: tuple[float, float, float] | None = None
        self._stepped = False  # whether ``_last`` is a receipt (a step is measured from one)

    def started(self) -> None:
        """The first epoch began (later epochs are not watched: the choice is made before them)."""
        with self._lock:
            if self._last is None:
                self._last = time.perf_counter(), time.process_time(), time.thread_time()

    def received(self, batch: Any, waited: float, cpu_waited: float) -> None:
        """The consumer got ``batch`` after waiting ``waited`` seconds (``cpu_waited`` of its thread's CPU)."""
        now, cpu, mine = time.perf_counter(), time.process_time(), time.thread_time()
        with self._lock:
            if self._last is not None:
                last, last_cpu, last_mine = self._last
                self._produced += max(0.0, (cpu - last_cpu) - (mine - last_mine) + cpu_waited)
                if self._stepped and len(self._steps) < OBSERVED:
                    self._steps.append(max(0.0, now - last - waited))
                if len(self._bytes) < OBSERVED:
                    self._bytes.append(batch_bytes(batch))
            self._batches += 1
            self._last = now, cpu, mine
            self._stepped = True

    def ready(self) -> bool:
        """Whether two batches were seen (an epoch of a single batch says nothing: 0 workers stay)."""
        with self._lock:
            return bool(self._steps)

    def choice(self, ranks_per_node: int, blocked: str | None = None) -> WorkerChoice:
        """The count for the next epochs (0 with ``blocked``: why workers cannot start here)."""
        with self._lock:
            produce = self._produced / max(1, self._batches)
            size = int(statistics.median(self._bytes))
            step = statistics.median(self._steps)
        if blocked is not None:
            return WorkerChoice(0, usable_cores(), ranks_per_node, produce, step, size,
                                f"worker processes cannot start here: {blocked}")
        return choose_workers(usable_cores(), ranks_per_node, produce, step, size)
