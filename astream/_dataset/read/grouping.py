"""Each batch's positions grouped by shard, worked out for many batches at once.

A shuffled batch of 32 small records spans several shards; reading it means one take
per shard, which needs the batch's positions grouped by shard. Grouping per batch (a
sort, a split, a fancy index per group) cost as much as reading the records. Here one
stable sort orders ``window`` (tuning.py) batches' positions by (batch, shard) together, and a
batch's groups are then slices of the sorted positions and of their offsets: views,
no per-batch sort. Memory: three arrays of a window's positions, not the epoch's.
"""

from __future__ import annotations

import itertools

import numpy as np
import numpy.typing as npt

from astream._dataset import tuning

__all__ = ["BatchGroups"]

Int64Array = npt.NDArray[np.int64]



class BatchGroups:
    """The shard groups of the batches ``bounds`` cuts ``shard``/``offset`` into."""

    def __init__(self, shard: Int64Array, offset: Int64Array, bounds: npt.NDArray[np.integer]) -> None:
        self._shard = shard
        self._offset = offset
        self._bounds = np.asarray(bounds, np.int64)
        self._first = -1  # the window's first batch
        self._order: Int64Array = np.zeros(0, np.int64)  # in-batch positions, grouped
        self._shards: list[int] = []
        self._offsets: Int64Array = np.zeros(0, np.int64)
        self._edges: list[int] = []  # cut points (window-relative) of every group
        self._batch_edges: list[int] = []  # index into _edges of each batch's first cut

    def groups(self, k: int) -> tuple[list[int], list[Int64Array], list[Int64Array]]:
        """Batch ``k``: its shards (ascending), each one's positions in the batch, and their offsets."""
        if not self._first <= k < self._first + tuning.READ_AHEAD.window or self._first < 0:
            self._group(k - k % tuning.READ_AHEAD.window)
        j = k - self._first
        lo, hi = self._batch_edges[j], self._batch_edges[j + 1]
        edges = self._edges[lo : hi + 1]
        shards = self._shards[lo:hi]
        pairs = list(itertools.pairwise(edges))
        positions = [self._order[a:b] for a, b in pairs]
        offsets = [self._offsets[a:b] for a, b in pairs]
        return shards, positions, offsets

    def _group(self, first: int) -> None:
        last = min(first + tuning.READ_AHEAD.window, len(self._bounds) - 1)
        a, b = int(self._bounds[first]), int(self._bounds[last])
        sizes = np.diff(self._bounds[first : last + 1])
        batch = np.repeat(np.arange(last - first, dtype=np.int64), sizes)
        shard = self._shard[a:b]
        span = int(shard.max()) + 1 if len(shard) else 1
        order = np.argsort(batch * span + shard, kind="stable")
        key = (batch * span + shard)[order]
        # A group ends where the (batch, shard) key changes; batch edges are among those.
        cuts = np.flatnonzero(key[1:] != key[:-1]) + 1
        edges = np.empty(len(cuts) + 2, np.int64)
        edges[0], edges[-1] = 0, len(order)
        edges[1:-1] = cuts
        group_batch = batch[order][edges[:-1]] if len(order) else np.zeros(0, np.int64)
        self._first = first
        # Positions relative to their batch's start: slices of it index the batch directly.
        starts = self._bounds[first:last] - a
        self._order = order - starts[batch[order]] if len(order) else order
        self._offsets = self._offset[a:b][order]
        self._shards = shard[order][edges[:-1]].tolist() if len(order) else []
        self._edges = edges.tolist()
        self._batch_edges = np.searchsorted(group_batch, np.arange(last - first + 1), side="left").tolist()
