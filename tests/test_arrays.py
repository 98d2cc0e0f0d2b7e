"""The np.unique stand-ins used before the first sample."""

from __future__ import annotations

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from astream._arrays import group_positions, sorted_unique

values = st.lists(st.integers(-5, 40), max_size=80).map(lambda v: np.array(v, np.int64))


@given(values)
def test_sorted_unique_is_np_unique(a: np.ndarray) -> None:
    got = sorted_unique(a)
    assert got.dtype == a.dtype
    assert got.tolist() == np.unique(a).tolist()


@given(values)
def test_group_positions(a: np.ndarray) -> None:
    keys, groups = group_positions(a)
    assert keys.tolist() == np.unique(a).tolist()
    if len(a):
        assert len(groups) == len(keys)
    for key, where in zip(keys.tolist(), groups, strict=False):
        assert where.tolist() == np.flatnonzero(a == key).tolist()
