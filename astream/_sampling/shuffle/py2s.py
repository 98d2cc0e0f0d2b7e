"""The ``py2s`` shuffle: shards shuffled twice, once for the run and once per epoch.

The run-wide generator (``seed``) orders the shards and shuffles each shard's samples;
the shards are then cut at the canonical-node boundaries, and the epoch generator
(``seed + epoch``) reorders the pieces of each node and shuffles each piece again.

MosaicML keeps one small object per shard with a view of its samples; here all samples
live in one int64 buffer and a shard (or piece of one) is a ``(start, end)`` range of it,
which is exactly a span, so the cutting reuses :func:`divide_spans`.
"""

from __future__ import annotations

import numpy as np

from astream._sampling.shuffle.spans import Int64Array, divide_spans, segment_arange, unit_spans

__all__ = ["shuffle_py2s"]


def shuffle_py2s(
    shard_sizes: Int64Array, num_canonical_nodes: int, seed: int, epoch: int, block_size: int
) -> Int64Array:
    """Return py2s's permutation for this epoch (``block_size`` is ignored)."""
    del block_size
    begins, ends = unit_spans(shard_sizes)
    num_samples = int(ends[-1]) if len(ends) else 0
    fixed_rng = np.random.default_rng(seed)
    order = np.arange(len(begins), dtype=np.int64)
    fixed_rng.shuffle(order)
    buffer = segment_arange(begins[order], ends[order])
    sizes = (ends - begins)[order]
    starts = np.cumsum(sizes) - sizes
    for start, size in zip(starts.tolist(), sizes.tolist(), strict=True):
        if size > 1:
            fixed_rng.shuffle(buffer[start : start + size])
    pieces = divide_spans(starts, starts + sizes, num_samples, num_canonical_nodes)
    epoch_rng = np.random.default_rng(seed + epoch)
    out = np.empty(num_samples, np.int64)
    bounds = pieces.part_bounds.tolist()
    written = 0
    for part in range(num_canonical_nodes):
        lo, hi = bounds[part], bounds[part + 1]
        perm = np.arange(lo, hi, dtype=np.int64)
        if hi - lo > 1:
            epoch_rng.shuffle(perm)
        for begin, end in zip(pieces.begins[perm].tolist(), pieces.ends[perm].tolist(), strict=True):
            piece = buffer[begin:end]
            if end - begin > 1:
                epoch_rng.shuffle(piece)
            out[written : written + end - begin] = piece
            written += end - begin
    return out
