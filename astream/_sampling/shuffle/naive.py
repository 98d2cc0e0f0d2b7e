"""The ``naive`` shuffle: one global permutation per epoch.

It ignores canonical nodes and the block size, so every node reads from every shard; only
sensible for single-node training on small data.
"""

from __future__ import annotations

import numpy as np

from astream._sampling.shuffle.spans import Int64Array

__all__ = ["shuffle_naive"]


def shuffle_naive(
    shard_sizes: Int64Array, num_canonical_nodes: int, seed: int, epoch: int, block_size: int
) -> Int64Array:
    """Return ``default_rng(seed + epoch).permutation(total samples)``."""
    del num_canonical_nodes, block_size  # part of the common signature, unused here
    total = int(shard_sizes.sum())
    return np.random.default_rng(seed + epoch).permutation(total).astype(np.int64, copy=False)
