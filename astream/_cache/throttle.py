"""Additive-increase / multiplicative-decrease control of how many transfers run at once.

It starts like TCP's slow start: from ``initial`` the limit doubles with each success
until it reaches the maximum, so the first shard gets the whole link (short time to
the first ready shard) and the pipe is full a few shards later. A throttled response
(HTTP 429/503, S3 SlowDown) halves the limit and ends slow start; from then on every
``limit`` successful transfers raise it by one, up to the maximum. A throttled bucket
thus slows astream down instead of failing it. Pure: no clock, no I/O.
"""

from __future__ import annotations

from astream._checks import check_int
from astream.errors import ConfigError

__all__ = ["Aimd"]


class Aimd:
    """The current concurrency limit, between ``minimum`` and ``maximum``."""

    def __init__(self, maximum: int, minimum: int = 1, decrease: float = 0.5, initial: int | None = None) -> None:
        check_int("max_concurrency", maximum, 1)
        if not 1 <= minimum <= maximum:
            raise ConfigError(f"minimum concurrency must be in 1..{maximum}, got {minimum!r}")
        if not 0.0 < decrease < 1.0:
            raise ConfigError(f"decrease must be a fraction in (0, 1), got {decrease!r}")
        self.maximum = maximum
        self.minimum = minimum
        self.decrease = decrease
        self.limit = maximum if initial is None else max(minimum, min(initial, maximum))
        self._slow_start = self.limit < maximum
        self._credit = 0

    def on_success(self) -> int:
        """A transfer succeeded: double the limit in slow start, else add one per ``limit`` successes."""
        if self._slow_start:
            self.limit = min(self.maximum, self.limit * 2)
            self._slow_start = self.limit < self.maximum
        elif self.limit < self.maximum:
            self._credit += 1
            if self._credit >= self.limit:
                self._credit = 0
                self.limit += 1
        return self.limit

    def on_throttle(self) -> int:
        """The remote asked us to slow down: cut the limit."""
        self.limit = max(self.minimum, int(self.limit * self.decrease))
        self._slow_start = False
        self._credit = 0
        return self.limit
