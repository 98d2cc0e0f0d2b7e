"""Where a consumer's time goes: its waits in ``next()`` and the pipeline's stages.

Always on, so each figure costs a ``perf_counter`` pair and a few additions:

- :class:`WaitHistogram` — the wait of each ``next()`` / ``__anext__`` in exponential
  buckets (powers of two of microseconds, as tf.data's ``GetNext`` histogram), with
  quantiles read off the buckets.
- :class:`StageTimes` — seconds and calls per pipeline stage (``read``, ``collate``,
  ``transform``, ``transport``) of this process. A loader worker process keeps its own
  and sends what it added (:meth:`StageTimes.take`) with the end of each epoch; the
  consumer's process merges it (:data:`STAGES`). The download and decode stages are the
  cache engine's (the node agent's counters).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any, TypeVar

__all__ = ["BUCKETS_S", "READY_S", "STAGES", "STAGE_NAMES", "StageTimes", "WaitHistogram"]

# Upper bounds of the buckets: 1 us, 2 us, 4 us ... 2**29 us (about 9 minutes); one more
# bucket holds anything longer.
BUCKETS_S: tuple[float, ...] = tuple(2.0**k / 1e6 for k in range(30))
# A next() answered within this is "ready": the batch was waiting (a queue hand-over costs
# microseconds; one that was not there costs at least a thread or process wake-up).
READY_S = 1e-3
T = TypeVar("T")
STAGE_NAMES = ("read", "collate", "transform", "transport")


def _bucket(seconds: float) -> int:
    if seconds <= BUCKETS_S[0]:
        return 0
    # the smallest k with 2**k us >= seconds
    k = math.ceil(math.log2(seconds * 1e6))
    return min(k, len(BUCKETS_S))


@dataclass
class WaitHistogram:
    """Waits in exponential buckets; ``counts[i]`` counts waits up to ``BUCKETS_S[i]``
    (the last one, anything longer)."""

    counts: list[int] = field(default_factory=lambda: [0] * (len(BUCKETS_S) + 1))
    total: int = 0
    sum_s: float = 0.0
    max_s: float = 0.0

    def add(self, seconds: float) -> None:
        self.counts[_bucket(seconds)] += 1
        self.total += 1
        self.sum_s += seconds
        if seconds > self.max_s:
            self.max_s = seconds

    def quantile(self, q: float) -> float:
        """The ``q`` quantile (0..1), as the upper bound of its bucket (0 before any wait).

        The bound of a bucket is at most twice any wait in it, so this errs high by less
        than a factor of two, never low; the largest wait caps it.
        """
        if not self.total:
            return 0.0
        rank = max(1, math.ceil(q * self.total))
        seen = 0
        for i, n in enumerate(self.counts):
            seen += n
            if seen >= rank:
                bound = BUCKETS_S[i] if i < len(BUCKETS_S) else self.max_s
                return min(bound, self.max_s)
        return self.max_s

    def copy(self) -> WaitHistogram:
        return WaitHistogram(list(self.counts), self.total, self.sum_s, self.max_s)


class _Timed:
    """``with STAGES.timed(stage):`` — a plain context manager (a generator-based one costs
    several times more per batch)."""

    __slots__ = ("_stage", "_start", "_times")

    def __init__(self, times: StageTimes, stage: str) -> None:
        self._times, self._stage, self._start = times, stage, 0.0

    def __enter__(self) -> None:
        self._start = time.perf_counter()

    def __exit__(self, *exc: object) -> None:
        self._times.add(self._stage, time.perf_counter() - self._start)


class StageTimes:
    """Seconds and calls per stage, added from any thread of this process."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        # stage -> [seconds, calls]; one list per stage, updated in place under the lock
        self._totals: dict[str, list[float]] = {k: [0.0, 0] for k in STAGE_NAMES}
        self._sent: dict[str, tuple[float, int]] = {}

    def add(self, stage: str, seconds: float, calls: int = 1) -> None:
        with self._lock:
            totals = self._totals.get(stage)
            if totals is None:
                totals = self._totals[stage] = [0.0, 0]
            totals[0] += seconds
            totals[1] += calls

    def timed(self, stage: str) -> _Timed:
        """Add the time the ``with`` block takes to ``stage`` (also when it raises)."""
        return _Timed(self, stage)

    def call(self, stage: str, fn: Callable[..., T], *args: Any) -> T:
        """``fn(*args)``, its time added to ``stage``."""
        start = time.perf_counter()
        try:
            return fn(*args)
        finally:
            self.add(stage, time.perf_counter() - start)

    def snapshot(self) -> dict[str, dict[str, float]]:
        """``{stage: {"seconds": s, "calls": n}}``."""
        with self._lock:
            return {k: {"seconds": v[0], "calls": int(v[1])} for k, v in self._totals.items()}

    def take(self) -> dict[str, tuple[float, int]]:
        """What was added since the last ``take`` (a worker process's report to its consumer)."""
        with self._lock:
            out = {}
            for k, (s, c) in self._totals.items():
                s0, c0 = self._sent.get(k, (0.0, 0))
                if c > c0:
                    out[k] = (s - s0, int(c - c0))
                self._sent[k] = (s, int(c))
            return out

    def merge(self, report: Mapping[str, Any]) -> None:
        """Add a worker process's :meth:`take`."""
        for stage, (seconds, calls) in report.items():
            self.add(str(stage), float(seconds), int(calls))


# This process's stages (the consumer's, its thread workers', and its worker processes' reports).
STAGES = StageTimes()
