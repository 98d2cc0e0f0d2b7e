"""How many samples each stream gives to the rest of an epoch whose mixture changed.

One pure rule, :func:`remainder_counts`, used by :mod:`astream._sampling.remix` (which
builds the plan) and by what reports it (``astream plan``, ``stats()``):

1. the rest of the epoch holds ``R = max(E' - S, 0)`` samples, ``E'`` the new mixture's
   epoch size (its ``epoch_size``, or the sum of its ``choose``) and ``S`` the samples the
   world consumed before the change;
2. stream ``i`` is given ``floor(R * p_i)``, ``p_i`` its share of the new mixture's epoch
   (proportion, or ``choose_i / E'`` for ``repeat``/``choose``); the samples those floors
   leave go one each to streams of nonzero share drawn by the change's generator (MosaicML's
   rule for an ``epoch_size``, except that a stream of weight 0 gets nothing);
3. a stream gives each of its unseen samples (not delivered in this epoch) at most once.
   A stream whose share is above its unseen samples gives them all (it *runs short*); its
   excess is shared by the streams that still have unseen samples and a weight above
   zero, in proportion to their weights (floors, then one each to the largest fractional
   parts, ties to the earlier stream), again as far as their unseen samples allow; when no
   stream has room, the epoch is that much shorter.

So the epoch keeps the new mixture's length whenever the unseen data allows, every
stream's count follows the new weights until it runs out, and nothing is repeated.
"""

from __future__ import annotations

import numpy as np
from numpy.typing import NDArray

__all__ = ["remainder_counts"]

Int64Array = NDArray[np.int64]
Float64Array = NDArray[np.float64]


def remainder_counts(
    total: int, proportion: Float64Array, unseen: Int64Array, rng: np.random.Generator
) -> tuple[Int64Array, Int64Array]:
    """The samples each stream gives to a remainder of ``total`` samples (rule in the module).

    Args:
        total: ``R``, the samples the new mixture wants in the rest of the epoch.
        proportion: each stream's share of the new mixture's epoch (sums to 1).
        unseen: each stream's samples not yet delivered in this epoch.
        rng: the change's generator (draws the floors' leftover, as ``apply_weights``).

    Returns:
        ``(wanted, counts)``: each stream's share before any stream ran short, and what it
        gives (``counts <= unseen``; ``counts.sum() == min(total, room)``, where ``room``
        is what the streams of nonzero share can give).
    """
    p = np.asarray(proportion, np.float64)
    have = np.asarray(unseen, np.int64)
    wanted = np.floor(total * p).astype(np.int64)
    leftover = total - int(wanted.sum())
    if leftover > 0:
        wanted[rng.choice(np.flatnonzero(p > 0), leftover, False)] += 1
    counts = wanted.copy()
    while True:
        over = counts > have
        excess = int((counts[over] - have[over]).sum())
        counts[over] = have[over]
        room = (counts < have) & (p > 0)
        if excess == 0 or not room.any():
            return wanted, counts
        counts += _share(excess, np.where(room, p, 0.0))


def _share(amount: int, weights: Float64Array) -> Int64Array:
    """``amount`` split in proportion to ``weights``: floors, then +1 to the largest fractions."""
    exact = amount * weights / weights.sum()
    out: Int64Array = np.floor(exact).astype(np.int64)
    short = amount - int(out.sum())
    if short > 0:
        frac = np.where(weights > 0, exact - out, -1.0)
        order = np.lexsort((np.arange(len(weights)), -frac))  # largest fraction first, then index
        out[order[:short]] += 1
    return out
