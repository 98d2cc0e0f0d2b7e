"""Shuffle algorithms: one permutation of an epoch's sample positions per call.

``get_shuffle`` has MosaicML Streaming's signature and meaning; the algorithms live in
one module per family (``naive``, ``py1`` for py1s/py1b/py1br, ``py1e``, ``py2s``);
``nodes`` drives the canonical-node-wise ones, which can also compute only some nodes.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Mapping, Sequence
from typing import Any

import numpy as np

from astream._sampling.shuffle.naive import shuffle_naive
from astream._sampling.shuffle.nodes import ShuffleParts
from astream._sampling.shuffle.py1 import py1b_parts, py1br_parts, py1s_parts
from astream._sampling.shuffle.py1e import py1e_parts
from astream._sampling.shuffle.py2s import shuffle_py2s
from astream._sampling.shuffle.spans import Int64Array
from astream._sampling.validation import check_choice, check_int
from astream.errors import ConfigError

__all__ = ["SHUFFLES", "ShuffleParts", "get_shuffle", "shuffle_parts"]

WholeFn = Callable[[Int64Array, int, int, int, int], Int64Array]
PartsFn = Callable[[Int64Array, int, int, int, int, Collection[int] | None, Mapping[int, dict[str, Any]] | None],
                   ShuffleParts]

# Algorithms that walk canonical nodes one by one can compute only some nodes' slices.
_BY_NODE: dict[str, PartsFn] = {
    "py1b": py1b_parts,
    "py1br": py1br_parts,
    "py1e": py1e_parts,
    "py1s": py1s_parts,
}
# The others need every draw's result: naive is one permutation, py2s shuffles every
# shard's samples with the run-wide generator before cutting the nodes.
_WHOLE: dict[str, WholeFn] = {"naive": shuffle_naive, "py2s": shuffle_py2s}

SHUFFLES = tuple(sorted([*_BY_NODE, *_WHOLE]))


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
    parts = shuffle_parts(algo, shard_sizes, num_canonical_nodes, seed, epoch, block_size)
    assert parts.full is not None
    return parts.full


def shuffle_parts(
    algo: str,
    shard_sizes: Sequence[int] | Int64Array,
    num_canonical_nodes: int,
    seed: int,
    epoch: int,
    block_size: int = 1 << 18,
    keep: Collection[int] | None = None,
    node_states: Mapping[int, dict[str, Any]] | None = None,
) -> ShuffleParts:
    """Like :func:`get_shuffle`, but only the slices of the canonical nodes in ``keep``.

    ``keep=None`` gives the whole permutation (in ``full``). naive and py2s always compute
    the whole permutation. ``node_states``: an earlier result's ``node_states`` for the same
    arguments but ``keep`` (see :func:`~astream._sampling.shuffle.nodes.shuffle_nodes`).

    Raises:
        ConfigError: an unknown algorithm or an out-of-range parameter.
    """
    check_choice("shuffle_algo", algo, SHUFFLES)
    sizes = np.asarray(shard_sizes, dtype=np.int64).reshape(-1)
    if (sizes < 0).any():
        raise ConfigError("shard_sizes must not be negative")
    ncn = check_int("num_canonical_nodes", num_canonical_nodes, 1)
    check_int("shuffle_seed", seed, 0)
    check_int("epoch", epoch, 0)
    block = check_int("shuffle_block_size", block_size, -(1 << 62))
    # The block-based algorithms draw from [int(0.75 b), int(1.25 b)) (py1br also from
    # [0, int(0.75 b))): NumPy refuses an empty range, so reject the sizes that make one.
    if algo == "py1br" and int(0.75 * block) < 1:
        raise ConfigError(f"shuffle_block_size must be >= 2 for py1br, got {block}")
    if algo in ("py1b", "py1e") and block < 1:
        raise ConfigError(f"shuffle_block_size must be >= 1 for {algo}, got {block}")
    if algo in _BY_NODE:
        return _BY_NODE[algo](sizes, ncn, int(seed), int(epoch), block, keep, node_states)
    total = int(sizes.sum())
    bounds = total * np.arange(ncn + 1, dtype=np.int64) // ncn
    return ShuffleParts(bounds, full=_WHOLE[algo](sizes, ncn, int(seed), int(epoch), block))
