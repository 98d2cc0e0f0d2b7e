"""The span bookkeeping shared by the shard-aware shuffles (py1b, py1br, py1e, py1s, py2s).

A *span* is a ``(begin, end)`` range of sample ids. MosaicML keeps spans as Python lists
of tuples and shuffles those lists with ``Generator.shuffle``; here they are two int64
arrays, and a list shuffle is replaced by shuffling an index array of the same length.
Both run the same Fisher-Yates loop (one ``random_interval(i)`` per ``i = n-1 .. 1``), so
the generator advances identically and the permutations agree bit for bit.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

__all__ = ["Spans", "divide_spans", "epoch_spans", "segment_arange", "unit_spans"]

Int64Array = NDArray[np.int64]


@dataclass(frozen=True)
class Spans:
    """Spans in traversal order, grouped into consecutive canonical-node parts.

    Attributes:
        begins: first sample id of each span.
        ends: one past the last sample id of each span.
        part_bounds: ``C + 1`` indices into the span arrays; part ``p`` holds spans
            ``part_bounds[p]:part_bounds[p + 1]``.
    """

    begins: Int64Array
    ends: Int64Array
    part_bounds: Int64Array

    @property
    def sizes(self) -> Int64Array:
        """Number of samples of each span."""
        return self.ends - self.begins


def unit_spans(shard_sizes: Int64Array) -> tuple[Int64Array, Int64Array]:
    """Return the consecutive ``(begin, end)`` ranges covered by shards of these sizes."""
    ends = np.cumsum(shard_sizes, dtype=np.int64)
    return ends - shard_sizes, ends


def segment_arange(begins: Int64Array, ends: Int64Array) -> Int64Array:
    """Concatenate ``arange(b, e)`` over all spans without one temporary per span.

    Writes the first value of each span as a jump relative to the previous span's last
    value, then integrates with one in-place ``cumsum``: a single O(N) allocation.
    """
    sizes = ends - begins
    total = int(sizes.sum())
    out = np.ones(total, np.int64)
    if total == 0:
        return out
    keep = sizes > 0
    starts = (np.cumsum(sizes) - sizes)[keep]
    first = begins[keep]
    last_before = np.empty_like(first)
    last_before[0] = 1  # so that out[0] becomes first[0] after the cumsum
    last_before[1:] = ends[keep][:-1]
    out[starts] = first - last_before + 1
    np.cumsum(out, out=out)
    return out


def divide_spans(begins: Int64Array, ends: Int64Array, num_samples: int, num_parts: int) -> Spans:
    """Cut spans at the canonical-node boundaries ``num_samples * (p + 1) // num_parts``.

    Same result as MosaicML's ``divide_spans``: spans are taken whole while they end at or
    before the boundary (empty spans included), a span that crosses it is split, the head
    closing this part and the tail opening the next one (where it may be split again).
    One searchsorted per part instead of one Python step per span.
    """
    sizes = ends - begins
    cum = np.cumsum(sizes, dtype=np.int64)
    num_spans = len(begins)
    out_b: list[Int64Array] = []
    out_e: list[Int64Array] = []
    bounds = np.zeros(num_parts + 1, np.int64)
    k = 0  # index of the current (possibly partly consumed) span
    head = int(begins[0]) if num_spans else 0  # where its unconsumed remainder begins
    so_far = 0
    count = 0
    for part in range(num_parts):
        part_end = num_samples * (part + 1) // num_parts
        k2 = int(np.searchsorted(cum, part_end, side="right"))
        if k2 > k:
            b = begins[k:k2].copy()
            b[0] = head
            out_b.append(b)
            out_e.append(ends[k:k2])
            count += k2 - k
            so_far = int(cum[k2 - 1])
            head = int(begins[k2]) if k2 < num_spans else 0
            k = k2
        if k < num_spans and so_far < part_end:
            split = part_end - so_far
            out_b.append(np.array([head], np.int64))
            out_e.append(np.array([head + split], np.int64))
            count += 1
            head += split
            so_far = part_end
        bounds[part + 1] = count
    if out_b:
        return Spans(np.concatenate(out_b), np.concatenate(out_e), bounds)
    empty = np.zeros(0, np.int64)
    return Spans(empty, empty.copy(), bounds)


def epoch_spans(
    shard_sizes: Int64Array, num_canonical_nodes: int, seed: int, epoch: int
) -> tuple[Spans, np.random.Generator, int]:
    """The prefix of py1b/py1br/py1e/py1s: run-wide span order, cut, per-epoch reorder.

    Returns:
        The spans in epoch order, the epoch generator (advanced past the per-part span
        shuffles, ready for the algorithm's own draws) and the total sample count.
    """
    begins, ends = unit_spans(shard_sizes)
    num_samples = int(ends[-1]) if len(ends) else 0
    # The run-wide order of shards is seeded by the seed alone, so a node keeps the same
    # shards (and its cache) across epochs.
    order = np.arange(len(begins), dtype=np.int64)
    np.random.default_rng(seed).shuffle(order)
    spans = divide_spans(begins[order], ends[order], num_samples, num_canonical_nodes)
    epoch_rng = np.random.default_rng(seed + epoch)
    perm = np.arange(len(spans.begins), dtype=np.int64)
    bounds = spans.part_bounds
    for part in range(num_canonical_nodes):
        lo, hi = int(bounds[part]), int(bounds[part + 1])
        if hi - lo > 1:  # shuffling fewer than two items draws nothing
            epoch_rng.shuffle(perm[lo:hi])
    return Spans(spans.begins[perm], spans.ends[perm], bounds), epoch_rng, num_samples
