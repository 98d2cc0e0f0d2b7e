"""Leases: how a worker's sequence of shards is grouped into pinned windows."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from astream._dataset.read.leases import leases_of


def _reference(shards: np.ndarray, gap: int) -> tuple[list[int], list[int], list[int]]:
    """The definition, one position at a time: a shard's occurrences at most ``gap`` apart share a lease."""
    open_lease: dict[int, list[int]] = {}  # shard -> [start, end] of its current lease
    leases: list[list[int]] = []
    for pos, shard in enumerate(shards.tolist()):
        cur = open_lease.get(shard)
        if cur is not None and pos - cur[1] <= gap:
            cur[1] = pos
            continue
        cur = [pos, pos, shard]
        open_lease[shard] = cur
        leases.append(cur)
    leases.sort(key=lambda lease: lease[0])
    return [x[2] for x in leases], [x[0] for x in leases], [x[1] for x in leases]


def test_unshuffled_epoch_is_one_lease_per_shard() -> None:
    shards = np.repeat(np.arange(4, dtype=np.int64), 1000)
    shard, start, end = leases_of(shards, 64)
    assert shard.tolist() == [0, 1, 2, 3]
    assert start.tolist() == [0, 1000, 2000, 3000]
    assert end.tolist() == [999, 1999, 2999, 3999]


def test_returning_shard_joins_or_splits_by_gap() -> None:
    shards = np.array([0, 0, 1, 1, 1, 0, 2, 2, 2, 2, 0], np.int64)
    # Shard 0 comes back 4 positions after its run ends (1 -> 5), then 5 (5 -> 10).
    assert [a.tolist() for a in leases_of(shards, 3)] == [[0, 1, 0, 2, 0], [0, 2, 5, 6, 10], [1, 4, 5, 9, 10]]
    assert [a.tolist() for a in leases_of(shards, 4)] == [[0, 1, 2, 0], [0, 2, 6, 10], [5, 4, 9, 10]]


def test_empty() -> None:
    assert all(len(a) == 0 for a in leases_of(np.zeros(0, np.int64), 8))


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(0, 5), max_size=200), st.integers(1, 12))
def test_matches_definition(values: list[int], gap: int) -> None:
    shards = np.array(values, np.int64)
    got = leases_of(shards, gap)
    assert tuple(a.tolist() for a in got) == _reference(shards, gap)
