"""The order of a rank's batches: the one author every reader of the plan consumes.

An :class:`~astream._sampling.plan.EpochPlan` says which sample ids each worker of each
rank reads. What a rank's loader hands out follows from it by two rules, written here
once:

- a worker reads its ids in order, padding (``-1``) dropped, cut into batches of the
  plan's ``batch_size``; with ``drop_last`` its last, shorter batch is dropped;
- the loader takes worker 0's first batch, worker 1's first batch, ..., then every
  worker's second batch, skipping workers that have run out (the torch DataLoader's
  round-robin, which MosaicML's resumption arithmetic assumes).

The epoch reader (one worker's batches), the worker pool (which worker's batch comes
next), ``Loader.batch_ids``, the adapters' cursors and ``EpochPlan.rank_order`` all call
these functions; nothing else re-derives the order.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING

import numpy as np
from numpy.typing import NDArray

if TYPE_CHECKING:
    from astream._sampling.plan import EpochPlan

__all__ = ["WorkerBatches", "batch_counts", "first_batch", "rank_batches", "round_robin", "worker_batches"]

Int64Array = NDArray[np.int64]


@dataclass(frozen=True, eq=False)
class WorkerBatches:
    """One worker's batches of an epoch: its ids (padding dropped) and the batch bounds.

    Batch ``k`` is ``ids[bounds[k]:bounds[k + 1]]``; every batch but possibly the last
    holds ``batch_size`` ids, and ids past the last bound (a dropped last batch) are
    never read.
    """

    ids: Int64Array
    bounds: Int64Array

    @classmethod
    def of(cls, ids: Int64Array, batch_size: int, drop_last: bool = False) -> WorkerBatches:
        """Cut ``ids`` (no padding) into batches of ``batch_size``."""
        if batch_size < 1:
            raise ValueError(f"batch_size must be >= 1, got {batch_size}")
        n = len(ids)
        stop = n - n % batch_size if drop_last else n
        bounds = np.arange(0, stop + batch_size, batch_size, dtype=np.int64)
        bounds[-1] = min(int(bounds[-1]), stop)  # the last batch may be short
        return cls(ids, bounds)

    @property
    def num_batches(self) -> int:
        return max(0, len(self.bounds) - 1)

    @property
    def num_samples(self) -> int:
        """Samples read (those of a dropped last batch excluded)."""
        return int(self.bounds[-1]) if len(self.bounds) else 0

    def batch(self, k: int) -> Int64Array:
        return self.ids[int(self.bounds[k]) : int(self.bounds[k + 1])]

    def batches(self) -> list[Int64Array]:
        return [self.batch(k) for k in range(self.num_batches)]


def worker_batches(plan: EpochPlan, node: int, local_rank: int, worker: int, *, drop_last: bool = False) -> WorkerBatches:
    """The batches worker ``worker`` of rank ``(node, local_rank)`` reads in ``plan``'s epoch.

    The last answer is kept on the plan: a resume asks the same twice in a row (the
    warm start's first shards at ``load_state_dict``, then the iteration's reader), and
    each costs a pass over the rest of the epoch. Its arrays are read-only, so the two
    askers cannot change each other's.
    """
    key = (node, local_rank, worker, drop_last)
    memo = plan.__dict__.get("_last_worker_batches")
    if memo is not None and memo[0] == key:
        return memo[1]  # type: ignore[no-any-return]
    ids = plan.worker_ids(node, local_rank, worker)
    order = WorkerBatches.of(ids[ids >= 0], plan.batch_size, drop_last)
    order.ids.flags.writeable = False
    order.bounds.flags.writeable = False
    plan.__dict__["_last_worker_batches"] = (key, order)
    return order


def first_batch(plan: EpochPlan, node: int, local_rank: int, worker: int, *, drop_last: bool = False) -> Int64Array:
    """The ids of batch 0 of :func:`worker_batches` (empty if it has none), computing only
    what they need where the plan allows it (:meth:`EpochPlan.worker_head`): a resume's
    first batch is wanted before the rest of its epoch."""
    memo = plan.__dict__.get("_last_worker_batches")
    if (memo is not None and memo[0] == (node, local_rank, worker, drop_last)) or plan.shuffle \
            or plan.batching_method != "random":
        # Kept, or the whole order is needed anyway (a shuffle's parts depend on every
        # position the worker uses): computed once, and kept for the reader.
        order = worker_batches(plan, node, local_rank, worker, drop_last=drop_last)
        return order.batch(0) if order.num_batches else order.ids[:0]
    head = plan.worker_head(node, local_rank, worker, plan.batch_size)
    return head[:0] if drop_last and len(head) < plan.batch_size else head


def num_batches(num_ids: int, batch_size: int, drop_last: bool) -> int:
    """Batches a worker with ``num_ids`` ids yields."""
    return num_ids // batch_size if drop_last else -(-num_ids // batch_size)


def batch_counts(plan: EpochPlan, node: int, local_rank: int, *, drop_last: bool = False) -> list[int]:
    """How many batches each worker of rank ``(node, local_rank)`` yields (no shuffle computed)."""
    return [num_batches(plan.worker_len(node, local_rank, w), plan.batch_size, drop_last)
            for w in range(plan.workers_per_rank)]


def round_robin(counts_per_worker: Sequence[int]) -> Int64Array:
    """The worker of each batch a rank's loader yields, given each worker's batch count.

    Round ``i`` takes batch ``i`` of every worker that has one, in worker order.
    """
    counts = np.asarray(counts_per_worker, np.int64)
    if counts.size == 0:
        return np.zeros(0, np.int64)
    rounds = np.arange(int(counts.max()), dtype=np.int64)
    has = rounds[:, None] < counts[None, :]  # (round, worker)
    return np.nonzero(has)[1].astype(np.int64)


def rank_batches(plan: EpochPlan, node: int, local_rank: int, *, drop_last: bool = False) -> list[Int64Array]:
    """The global sample ids of each batch rank ``(node, local_rank)``'s loader yields, in order."""
    # One shuffle of the rank's share for all its workers (each worker's own would redo it).
    ids = plan.rank_ids(node, local_rank).reshape(plan.workers_per_rank, -1)
    per_worker = [WorkerBatches.of(row[row >= 0], plan.batch_size, drop_last) for row in ids]
    taken = [0] * len(per_worker)
    out = []
    for w in round_robin([wb.num_batches for wb in per_worker]).tolist():
        out.append(per_worker[w].batch(taken[w]))
        taken[w] += 1
    return out
