"""The pure parts of the cache: the eviction choice and the AIMD throttle."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from astream._cache.eviction import Candidate, choose_victims
from astream._cache.throttle import Aimd
from astream.errors import ConfigError

candidates = st.lists(
    st.builds(
        Candidate,
        key=st.integers(0, 10_000),
        size=st.integers(0, 1000),
        last_used=st.integers(0, 100),
        pinned=st.booleans(),
        evictable=st.booleans(),
    ),
    max_size=30,
    unique_by=lambda c: c.key,
)


@given(cands=candidates, need=st.integers(0, 5000), limit=st.none() | st.integers(0, 20_000))
def test_eviction_choice(cands: list[Candidate], need: int, limit: int | None) -> None:
    used = sum(c.size for c in cands)
    victims = choose_victims(cands, used, need, limit)
    by_key = {c.key: c for c in cands}
    if limit is None or used + need <= limit:
        assert victims == []
        return
    free = [c for c in cands if not c.pinned and c.evictable and c.size > 0]
    if used - sum(c.size for c in free) + need > limit:
        assert victims is None
        return
    assert victims is not None
    chosen = [by_key[k] for k in victims]
    assert all(not c.pinned and c.evictable for c in chosen)
    assert used - sum(c.size for c in chosen) + need <= limit
    # least recently used first, and no more than needed: without the last one it would not fit
    assert [(c.last_used, c.key) for c in chosen] == sorted((c.last_used, c.key) for c in chosen)
    assert used - sum(c.size for c in chosen[:-1]) + need > limit
    oldest_kept = [c.last_used for c in free if c.key not in victims]
    assert not oldest_kept or max(c.last_used for c in chosen) <= min(oldest_kept)


def test_eviction_prefers_the_least_recently_used() -> None:
    cands = [Candidate(0, 10, 5), Candidate(1, 10, 1), Candidate(2, 10, 3, pinned=True), Candidate(3, 10, 2)]
    assert choose_victims(cands, 40, 15, 40) == [1, 3]
    assert choose_victims(cands, 40, 35, 40) is None


def test_aimd_halves_on_throttle_and_climbs_back() -> None:
    aimd = Aimd(8)
    assert aimd.limit == 8
    assert aimd.on_throttle() == 4
    assert aimd.on_throttle() == 2
    assert aimd.on_throttle() == 1
    assert aimd.on_throttle() == 1
    limits = [aimd.on_success() for _ in range(1 + 2 + 3 + 4)]
    assert limits[-1] == 5
    for _ in range(100):
        aimd.on_success()
    assert aimd.limit == 8


@given(events=st.lists(st.booleans(), max_size=200), maximum=st.integers(1, 64))
def test_aimd_stays_in_range(events: list[bool], maximum: int) -> None:
    aimd = Aimd(maximum)
    for ok in events:
        limit = aimd.on_success() if ok else aimd.on_throttle()
        assert 1 <= limit <= maximum


@pytest.mark.parametrize("maximum", [0, -1, True, 2.5])
def test_aimd_rejects_bad_limits(maximum: object) -> None:
    with pytest.raises(ConfigError, match="max_concurrency"):
        Aimd(maximum)  # type: ignore[arg-type]


def test_aimd_slow_start_doubles_until_the_first_throttle() -> None:
    aimd = Aimd(16, initial=1)
    assert [aimd.on_success() for _ in range(5)] == [2, 4, 8, 16, 16]
    aimd = Aimd(16, initial=1)
    aimd.on_success()
    assert aimd.on_throttle() == 1
    assert [aimd.on_success() for _ in range(3)] == [2, 2, 3]  # additive from now on
