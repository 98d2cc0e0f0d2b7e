"""Batches grouped by shard many at a time give the groups of one batch at a time."""

from __future__ import annotations

import numpy as np
import pytest

from astream._arrays import group_positions
from astream._dataset import tuning
from astream._dataset.read.grouping import BatchGroups

WINDOW = tuning.READ_AHEAD.window


@pytest.mark.parametrize("seed", range(6))
def test_groups_match_the_per_batch_grouping(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 3 * WINDOW * 8))
    shard = rng.integers(0, int(rng.integers(1, 20)), n).astype(np.int64)
    offset = rng.integers(0, 10_000, n).astype(np.int64)
    batch = int(rng.integers(1, 40))
    bounds = np.arange(0, n + batch, batch, dtype=np.int64)
    bounds[-1] = min(int(bounds[-1]), n)
    groups = BatchGroups(shard, offset, bounds)
    order = list(range(len(bounds) - 1))
    rng.shuffle(order)  # any order of batches, across windows
    for k in order:
        a, b = int(bounds[k]), int(bounds[k + 1])
        uniq, expected = group_positions(shard[a:b])
        shards, positions, offsets = groups.groups(k)
        assert shards == uniq.tolist()
        assert len(positions) == len(expected)
        for got, want, off in zip(positions, expected, offsets, strict=True):
            np.testing.assert_array_equal(got, want)
            np.testing.assert_array_equal(off, offset[a:b][want])
