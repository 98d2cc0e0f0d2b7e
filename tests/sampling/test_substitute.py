"""The substitution rule of on_bad_sample="skip" (pure: astream._sampling.substitute)."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from astream._sampling.substitute import in_batch, outside

flags = st.lists(st.booleans(), min_size=1, max_size=64)


@given(flags)
def test_good_positions_keep_their_sample_and_bad_ones_take_a_good_one(bad: list[bool]) -> None:
    src = in_batch(np.array(bad))
    if all(bad):
        assert src is None
        return
    assert src is not None
    assert len(src) == len(bad)  # the batch keeps its size
    for i, s in enumerate(src.tolist()):
        assert not bad[s]  # a substitute is good
        if not bad[i]:
            assert s == i


@given(flags)
def test_a_bad_position_takes_the_next_good_one_wrapping_round(bad: list[bool]) -> None:
    src = in_batch(np.array(bad))
    if src is None:
        return
    n = len(bad)
    for i in range(n):
        if bad[i]:
            expected = next((i + d) % n for d in range(1, n + 1) if not bad[(i + d) % n])
            assert src[i] == expected


@given(flags)
def test_the_rule_reads_only_the_flags(bad: list[bool]) -> None:
    # Deterministic: the same flags, the same substitutes (whatever was known before and how).
    a, b = in_batch(np.array(bad)), in_batch(np.array(list(bad)))
    assert (a is None and b is None) or (a is not None and b is not None and (a == b).all())


def test_examples() -> None:
    assert in_batch(np.array([False, True, False, True])).tolist() == [0, 2, 2, 0]  # type: ignore[union-attr]
    assert in_batch(np.array([True, True, False])).tolist() == [2, 2, 2]  # type: ignore[union-attr]


@given(st.integers(0, 50), st.integers(0, 50), st.integers(0, 50))
def test_outside_tries_the_nearest_later_first_then_earlier_and_never_the_batch(x: int, y: int, z: int) -> None:
    start, stop, length = sorted((x, y, z))
    tried = list(outside(start, stop, length))
    assert tried == [*range(stop, length), *range(start - 1, -1, -1)]
    assert not set(tried) & set(range(start, stop))
    assert len(tried) == len(set(tried)) == length - (stop - start)
