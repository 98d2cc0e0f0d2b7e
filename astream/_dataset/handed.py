"""What a loader's consumer received: each batch counted as it is handed over.

The one owner of a :class:`~astream._dataset.loader.Loader`'s counts of what its training
loop got: the samples of the current iteration (``num_samples_yielded``, which
``state_dict`` turns into a position), the waits of every ``next()`` (``stats()``), the
progress bar, and the first epoch's costs that ``num_workers="auto"`` chooses from. A
batch is counted where the caller receives it (in the caller's thread for ``for``, on the
loop for ``async for``), not where a worker or the loop thread made it, and a batch with
substitutes (``on_bad_sample="skip"``) has its bad samples recorded first.
"""

from __future__ import annotations

import time
from collections.abc import AsyncIterator
from typing import Any

import numpy as np

from astream._dataset import quarantine as bad
from astream._dataset.observe.progress import ProgressBar
from astream._dataset.observe.stats import ConsumerCounters
from astream._dataset.workers.autowatch import CostWatch

__all__ = ["Handed", "batch_length"]


def batch_length(batch: Any) -> int:
    """Samples in a batch: a dict's first column, a sequence, or an array's first axis."""
    if isinstance(batch, dict):
        if not batch:
            return 0
        return batch_length(next(iter(batch.values())))
    if isinstance(batch, np.ndarray):
        return int(batch.shape[0]) if batch.ndim else 1
    if hasattr(batch, "shape") and getattr(batch, "shape", None):
        return int(batch.shape[0])
    try:
        return len(batch)
    except TypeError:
        return 1


class Handed:
    """One loader's counts of the batches its consumer received.

    Args:
        progress: show a progress bar of each iteration.
        book: skip mode's record of bad samples (None: no skip mode).
        watch: the first epoch's costs for ``num_workers="auto"`` (None once it chose, or without it).
    """

    def __init__(self, progress: bool, book: bad.QuarantineBook | None, watch: CostWatch | None) -> None:
        self.samples = 0  # of the current iteration (num_samples_yielded)
        self.consumer = ConsumerCounters()  # over the loader's life, all epochs
        self.epoch_samples: int | None = None  # this iteration's, for the bar
        self.watch = watch
        self._progress = progress
        self._book = book
        self._bar: ProgressBar | None = None

    def take(self, batch: Any, asked: float, last: float, cpu_waited: float = 0.0) -> tuple[Any, float]:
        """``batch`` as the caller receives it, asked for at ``asked`` (the previous one handed
        over at ``last``), counted; and the time it was handed over."""
        batch = bad.handed(self._book, batch) if type(batch) is bad.Substituted else batch
        now = time.perf_counter()
        if self.watch is not None:
            self.watch.received(batch, now - asked, cpu_waited)
        n = batch_length(batch)
        self.samples += n
        self.consumer.received(n, now - asked, now - last)
        if self._progress:
            if self._bar is None:
                self._bar = ProgressBar(self.consumer, self.epoch_samples)
            self._bar.update(n)
        return batch, now

    def end(self) -> None:
        """An iteration ended: its bar closes."""
        bar, self._bar = self._bar, None
        if bar is not None:
            bar.close()

    async def counted(self, batches: AsyncIterator[Any]) -> AsyncIterator[Any]:
        """``batches`` as an ``async for`` receives them, each counted."""
        it = batches.__aiter__()
        if self.watch is not None:
            self.watch.started()  # the first epoch's start (a no-op after it)
        last = time.perf_counter()
        try:
            while True:
                asked, cpu = time.perf_counter(), time.thread_time()
                try:
                    batch = await it.__anext__()
                except StopAsyncIteration:
                    return
                batch, last = self.take(batch, asked, last, time.thread_time() - cpu)
                yield batch
        finally:
            self.end()
