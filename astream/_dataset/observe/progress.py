"""``Loader(progress=True)``: a tqdm bar of samples with the rate and the stall share.

The bar counts samples as the consumer receives them; its postfix shows the share of
the iteration so far the consumer spent waiting in ``next()`` (``stall``) and the share
of ``next()`` calls answered at once (``ready``). Refreshing costs a few microseconds
per batch (tqdm redraws at most ten times a second).
"""

from __future__ import annotations

import time
from typing import Any

from astream._dataset.observe.stats import ConsumerCounters
from astream.errors import ConfigError

__all__ = ["ProgressBar"]

_REFRESH_S = 0.5  # how often the postfix is recomputed


class ProgressBar:
    """One iteration's bar; ``counters`` are the loader's, read as differences from the start.

    Raises:
        ConfigError: tqdm is not installed.
    """

    def __init__(self, counters: ConsumerCounters, total: int | None, desc: str = "astream") -> None:
        try:
            from tqdm.auto import tqdm
        except ImportError as exc:  # pragma: no cover - tqdm is a dependency
            raise ConfigError("Loader(progress=True) needs tqdm: pip install tqdm") from exc
        self._counters = counters
        self._start = counters.copy()
        self._bar: Any = tqdm(total=total, desc=desc, unit="sample", unit_scale=True, dynamic_ncols=True)
        self._next_refresh = 0.0

    def figures(self) -> tuple[float, float]:
        """``(stall, ready)`` of this iteration so far."""
        c, s = self._counters, self._start
        elapsed, wait, batches = c.elapsed_s - s.elapsed_s, c.wait_s - s.wait_s, c.batches - s.batches
        stall = wait / elapsed if elapsed > 0 else 0.0
        ready = (c.ready - s.ready) / batches if batches else 0.0
        return min(1.0, stall), ready

    def update(self, samples: int) -> None:
        self._bar.update(samples)
        now = time.perf_counter()
        if now >= self._next_refresh:
            self._next_refresh = now + _REFRESH_S
            self._show()

    def _show(self) -> None:
        stall, ready = self.figures()
        self._bar.set_postfix_str(f"stall {stall:.0%}, ready {ready:.0%}", refresh=False)

    def close(self) -> None:
        self._show()
        self._bar.close()
