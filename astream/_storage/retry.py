"""Timeouts and the retry schedule of remote transfers, as pure validated values.

Nothing here does I/O: :class:`Timeouts` and :class:`RetryPolicy` are frozen
dataclasses (like aiohttp's ``ClientTimeout``) that check their fields once, and
:meth:`RetryPolicy.delay` turns an attempt number (and a server's ``Retry-After``)
into the seconds to sleep, so the schedule is tested without a clock or a socket.

:class:`Transient` is the failure a backend raises when another attempt may fix it.

The worst case of one transfer is bounded by :meth:`RetryPolicy.worst_case`:
``timeouts.download * (retries + 1)`` plus the sum of the longest back-offs.
"""

from __future__ import annotations

import email.utils
import math
import random
import time
from dataclasses import dataclass

from astream._checks import check_int
from astream.errors import ConfigError

__all__ = ["RetryPolicy", "Timeouts", "Transient", "parse_retry_after"]


class Transient(Exception):
    """One attempt failed in a way that another attempt may fix.

    Attributes:
        retry_after: seconds the server asked us to wait, if it said.
        throttled: the server is shedding load (429, 503, SlowDown): callers slow down.
    """

    def __init__(self, message: str, *, retry_after: float | None = None, throttled: bool = False) -> None:
        super().__init__(message)
        self.retry_after = retry_after
        self.throttled = throttled


def _check_seconds(name: str, value: float, *, allow_zero: bool = False) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or math.isnan(value):
        raise ConfigError(f"{name} must be a number of seconds, got {value!r}")
    if value < 0 or (value == 0 and not allow_zero) or math.isinf(value):
        raise ConfigError(f"{name} must be a positive, finite number of seconds, got {value!r}")


@dataclass(frozen=True)
class Timeouts:
    """How long one transfer may take.

    Attributes:
        download: seconds one attempt at one file may take from request to last byte
            (MosaicML's ``download_timeout``).
        connect: seconds to open a connection (also bounded by ``download``).
    """

    download: float = 60.0
    connect: float = 10.0

    def __post_init__(self) -> None:
        _check_seconds("download_timeout", self.download)
        _check_seconds("connect_timeout", self.connect)


@dataclass(frozen=True)
class RetryPolicy:
    """When and how long to wait before trying a failed transfer again.

    Transient failures (connection errors, timeouts, HTTP 5xx and 429, S3 SlowDown)
    are retried ``retries`` times with exponential back-off and full jitter; a server's
    ``Retry-After`` is honoured up to ``max_backoff``. Other failures are not retried.

    Attributes:
        retries: extra attempts after the first one (MosaicML's ``download_retry``).
        backoff: the first back-off in seconds; attempt ``n`` waits up to ``backoff * 2**n``.
        max_backoff: the cap of one back-off, also applied to ``Retry-After``.
        jitter: fraction of each back-off that is randomised (0: none, 1: full jitter).
        yield_to_throttle: a throttled answer (429, 503, SlowDown) ends the attempts at once
            instead of being retried: the policy of a hint (a ranged read ahead of the
            node's transfer, which slows down for the remote instead and fetches the bytes).
    """

    retries: int = 2
    backoff: float = 0.25
    max_backoff: float = 10.0
    jitter: float = 0.5
    yield_to_throttle: bool = False

    def __post_init__(self) -> None:
        check_int("download_retry", self.retries, 0)
        _check_seconds("backoff", self.backoff, allow_zero=True)
        _check_seconds("max_backoff", self.max_backoff, allow_zero=True)
        if not isinstance(self.jitter, (int, float)) or not 0.0 <= self.jitter <= 1.0:
            raise ConfigError(f"jitter must be a fraction between 0 and 1, got {self.jitter!r}")

    @property
    def attempts(self) -> int:
        """Total attempts: the first one plus the retries."""
        return self.retries + 1

    def delay(self, attempt: int, retry_after: float | None = None, rng: random.Random | None = None) -> float:
        """Seconds to wait after failed attempt number ``attempt`` (0-based).

        Args:
            attempt: the attempt that just failed, counting from 0.
            retry_after: the server's requested wait, if it sent one.
            rng: a random source (tests pass a seeded one).

        Returns:
            A wait in ``[0, max_backoff]``; at least ``retry_after`` when given (capped).
        """
        ceiling = min(self.max_backoff, self.backoff * (2.0 ** max(0, attempt)))
        spread = (rng or random).random() * self.jitter * ceiling
        wait = ceiling - spread
        if retry_after is not None and retry_after > 0:
            wait = max(wait, min(retry_after, self.max_backoff))
        return max(0.0, min(wait, self.max_backoff))

    def worst_case(self, timeouts: Timeouts) -> float:
        """Upper bound in seconds on one transfer, all attempts and back-offs included."""
        waits = sum(min(self.max_backoff, self.backoff * 2.0**a) for a in range(self.retries))
        return timeouts.download * self.attempts + waits


def parse_retry_after(value: str | None, now: float | None = None) -> float | None:
    """Parse an HTTP ``Retry-After`` header (delta seconds or an HTTP date).

    Returns:
        Seconds to wait (never negative), or None when absent or unparsable.
    """
    if not value:
        return None
    value = value.strip()
    try:
        seconds = float(value)
    except ValueError:
        try:
            when = email.utils.parsedate_to_datetime(value)
        except (TypeError, ValueError, IndexError):
            return None
        if when is None:
            return None
        seconds = when.timestamp() - (time.time() if now is None else now)
    if math.isnan(seconds):
        return None
    return max(0.0, seconds)
