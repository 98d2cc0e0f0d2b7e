"""What the first batches of a ``num_workers="auto"`` loader cost, noted as they are handed out.

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
    """The first :data:`OBSERVED` batches' production cost and consumer step."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._produce: list[float] = []
        self._bytes: list[int] = []
        self._steps: list[float] = []
        # When the consumer received the previous batch: wall, process CPU, its thread's CPU.
        self._last: tuple[float, float, float] | None = None

    def received(self, batch: Any, waited: float, cpu_waited: float) -> None:
        """The consumer got ``batch`` after waiting ``waited`` seconds (``cpu_waited`` of its thread's CPU)."""
        now, cpu, mine = time.perf_counter(), time.process_time(), time.thread_time()
        with self._lock:
            if self._last is not None and len(self._steps) < OBSERVED:
                last, last_cpu, last_mine = self._last
                self._steps.append(max(0.0, now - last - waited))
                self._produce.append(max(0.0, (cpu - last_cpu) - (mine - last_mine) + cpu_waited))
                self._bytes.append(batch_bytes(batch))
            self._last = now, cpu, mine

    def ready(self) -> bool:
        """Whether two batches were seen (an epoch of a single batch says nothing: 0 workers stay)."""
        with self._lock:
            return bool(self._produce)

    def choice(self, ranks_per_node: int, blocked: str | None = None) -> WorkerChoice:
        """The count for the next epochs (0 with ``blocked``: why workers cannot start here)."""
        with self._lock:
            produce = statistics.median(self._produce)
            size = int(statistics.median(self._bytes))
            step = statistics.median(self._steps)
        if blocked is not None:
            return WorkerChoice(0, usable_cores(), ranks_per_node, produce, step, size,
                                f"worker processes cannot start here: {blocked}")
        return choose_workers(usable_cores(), ranks_per_node, produce, step, size)
