"""Which sample stands in for a bad one: the substitution rule of ``on_bad_sample="skip"``.

A bad sample (it does not decode, its shard fails its hash after a fresh download, or
the user's transform raises a listed exception on it) is replaced **inside its own
batch**, so every rank yields exactly the batches the plan gives it, with the same sizes,
and no rank ever waits for another or asks another what it skipped. The rule is a pure
function of the batch and of which of its positions are bad; since being bad is a
property of the bytes (and of a deterministic transform), every rerun and every resume
makes the same substitutions without any of them being written down first.

The rule, in order:

1. **A repeat of the next good sample of the same batch**: a bad position takes the
   sample of the first good position after it, wrapping round to the batch's start
   (:func:`in_batch`). The batch is one of the plan's global batches, so this is the same
   whatever the number of nodes, ranks and workers.
2. A batch with no good sample at all (a whole shard lost under a batch that reads only
   it): every position repeats **one good sample of the same worker's sequence**, the
   nearest after the batch, else (at the sequence's end) the nearest before it
   (:func:`outside`, in the order they are tried). Later first, because a resumed
   worker's sequence is the tail of the one it resumes: what follows a batch is the same
   after a resume, what precedes it is cut at the resume point. That sequence depends on
   the world's shape, so this second case is deterministic for a given world (the same on
   a rerun and a resume in that world; the one exception: a batch near the sequence's end
   with no good sample after it, resumed between it and every good sample before it).
3. A worker with no good sample at all: nothing can stand in; the reader raises.

A substitute is a repeat: the sample is also yielded in its own place.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np
import numpy.typing as npt

__all__ = ["in_batch", "outside"]

BoolArray = npt.NDArray[np.bool_]
Int64Array = npt.NDArray[np.int64]


def in_batch(bad: BoolArray) -> Int64Array | None:
    """Where each position of a batch takes its sample from (rule 1).

    Args:
        bad: one flag per position of the batch, True where the sample is bad.

    Returns:
        For each position, the position (in ``0..len(bad)-1``) whose sample it yields: itself
        where it is good, else the first good position after it, wrapping round. None when
        every position is bad (rule 2 applies).
    """
    bad = np.asarray(bad, dtype=np.bool_)
    good = np.flatnonzero(~bad)
    if not len(good):
        return None
    nxt = np.searchsorted(good, np.arange(len(bad)), side="left")
    return good[nxt % len(good)].astype(np.int64)


def outside(start: int, stop: int, length: int) -> Iterator[int]:
    """The positions of a worker's sequence tried, in order, for an all-bad batch (rule 2).

    Args:
        start: the batch's first position in the worker's sequence.
        stop: the position after its last.
        length: how many positions the worker's sequence has.

    Yields:
        ``stop`` up to ``length - 1`` (the nearest later sample first), then ``start - 1``
        down to 0.
    """
    yield from range(stop, length)
    yield from range(start - 1, -1, -1)
