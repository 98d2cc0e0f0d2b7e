"""The retry schedule and timeout config, without a clock or a socket."""

from __future__ import annotations

import random

import pytest
from hypothesis import given
from hypothesis import strategies as st

from astream._storage.retry import RetryPolicy, Timeouts, parse_retry_after
from astream.errors import ConfigError


@given(
    attempt=st.integers(0, 40),
    backoff=st.floats(0, 5),
    max_backoff=st.floats(0, 30),
    jitter=st.floats(0, 1),
    retry_after=st.none() | st.floats(0, 1000),
    seed=st.integers(0, 2**32),
)
def test_delay_stays_within_bounds(
    attempt: int, backoff: float, max_backoff: float, jitter: float, retry_after: float | None, seed: int
) -> None:
    policy = RetryPolicy(retries=3, backoff=backoff, max_backoff=max_backoff, jitter=jitter)
    wait = policy.delay(attempt, retry_after, random.Random(seed))
    assert 0.0 <= wait <= max_backoff
    ceiling = min(max_backoff, backoff * 2.0**attempt)
    assert wait <= max(ceiling, min(retry_after or 0.0, max_backoff)) + 1e-9
    assert wait >= ceiling * (1 - jitter) - 1e-9
    if retry_after is not None:
        assert wait >= min(retry_after, max_backoff) - 1e-9


def test_backoff_grows_exponentially_without_jitter() -> None:
    policy = RetryPolicy(retries=5, backoff=0.1, max_backoff=1.0, jitter=0.0)
    assert [policy.delay(a) for a in range(6)] == pytest.approx([0.1, 0.2, 0.4, 0.8, 1.0, 1.0])


def test_worst_case_bounds_all_attempts() -> None:
    policy = RetryPolicy(retries=2, backoff=0.5, max_backoff=0.6, jitter=0.0)
    assert policy.attempts == 3
    assert policy.worst_case(Timeouts(download=2.0)) == pytest.approx(2.0 * 3 + 0.5 + 0.6)


@pytest.mark.parametrize(
    "kwargs",
    [{"retries": -1}, {"retries": 1.5}, {"retries": True}, {"backoff": -1}, {"jitter": 2}, {"max_backoff": float("nan")}],
)
def test_bad_retry_policy_is_a_config_error(kwargs: dict[str, object]) -> None:
    with pytest.raises(ConfigError):
        RetryPolicy(**kwargs)  # type: ignore[arg-type]


@pytest.mark.parametrize("kwargs", [{"download": 0}, {"download": -1}, {"connect": float("inf")}, {"download": "5"}])
def test_bad_timeouts_are_a_config_error(kwargs: dict[str, object]) -> None:
    with pytest.raises(ConfigError, match="timeout"):
        Timeouts(**kwargs)  # type: ignore[arg-type]


def test_config_is_frozen() -> None:
    with pytest.raises(AttributeError):
        RetryPolicy().retries = 4  # type: ignore[misc]


@pytest.mark.parametrize(
    ("header", "expected"),
    [
        ("3", 3.0),
        (" 0.5 ", 0.5),
        ("-4", 0.0),
        ("Wed, 21 Oct 2015 07:28:00 GMT", 10.0),
        ("soon", None),
        ("", None),
        (None, None),
    ],
)
def test_parse_retry_after(header: str | None, expected: float | None) -> None:
    now = 1445412470.0  # ten seconds before the date above
    assert parse_retry_after(header, now=now) == expected
