"""Shuffle algorithms: one permutation of an epoch's sample positions per call.

``get_shuffle`` has MosaicML Streaming's signature and meaning; the algorithms live in
one module per family (``naive``, ``py1`` for py1s/py1b/py1br, ``py1e``, ``py2s``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

import numpy as np

from astream._sampling.shuffle.naive import shuffle_naive
from astream._sampling.shuffle.py1 import shuffle_py1b, shuffle_py1br, shuffle_py1s
from astream._sampling.shuffle.py1e import shuffle_py1e
from astream._sampling.shuffle.py2s import shuffle_py2s
from astream._sampling.shuffle.spans import Int64Array
from astream._sampling.validation import check_choice, check_int
from astream.errors import ConfigError

__all__ = ["SHUFFLES", "get_shuffle"]

ShuffleFn = Callable[[Int64Array, int, int, int, int], Int64Array]

SHUFFLES: dict[str, ShuffleFn] = {
    "naive": shuffle_naive,
    "py1b": shuffle_py1b,
    "py1br": shuffle_py1br,
    "py1e": shuffle_py1e,
    "py1s": shuffle_py1s,
    "py2s": shuffle_py2s,
}


def get_shuffle(
    algo: str,
    shard_sizes: Sequence[int] | Int64Array,
    num_canonical_nodes: int,
    seed: int,
    epoch: int,
    block_size: int = 1 << 18,
) -> Int64Array:
    """Return the shuffled order of an epoch's samples (position -> sample id).

    Bit-exact with MosaicML Streaming 0.13's function of this name (``py1b`` as in 0.9.1).

    Args:
        algo: one of ``naive``, ``py1b``, ``py1br``, ``py1e``, ``py1s``, ``py2s``.
        shard_sizes: number of samples of each shard (or shuffle unit), in order.
        num_canonical_nodes: canonical node count; the shard-aware algorithms keep each
            node's samples inside its slice ``[N*i//C, N*(i+1)//C)`` of the positions.
        seed: run-wide seed (>= 0); ``seed`` orders the shards for the whole run.
        epoch: epoch (>= 0); ``seed + epoch`` seeds what changes every epoch.
        block_size: unit of shuffle for ``py1b``, ``py1br`` and ``py1e``.

    Returns:
        An int64 permutation of ``range(sum(shard_sizes))``.

    Raises:
        ConfigError: an unknown algorithm or an out-of-range parameter.
    """
    check_choice("shuffle_algo", algo, tuple(SHUFFLES))
    sizes = np.asarray(shard_sizes, dtype=np.int64).reshape(-1)
    if (sizes < 0).any():
        raise ConfigError("shard_sizes must not be negative")
    check_int("num_canonical_nodes", num_canonical_nodes, 1)
    check_int("shuffle_seed", seed, 0)
    check_int("epoch", epoch, 0)
    block = check_int("shuffle_block_size", block_size, -(1 << 62))
    # The block-based algorithms draw from [int(0.75 b), int(1.25 b)) (py1br also from
    # [0, int(0.75 b))): NumPy refuses an empty range, so reject the sizes that make one.
    if algo == "py1br" and int(0.75 * block) < 1:
        raise ConfigError(f"shuffle_block_size must be >= 2 for py1br, got {block}")
    if algo in ("py1b", "py1e") and block < 1:
        raise ConfigError(f"shuffle_block_size must be >= 1 for {algo}, got {block}")
    return SHUFFLES[algo](sizes, int(num_canonical_nodes), int(seed), int(epoch), block)
