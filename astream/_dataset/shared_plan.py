"""A worker's batches of a shuffled plan, from the generator states the node's processes share.

A rank's plan computes only its canonical nodes' part of the shuffle, but must walk the draws
of every canonical node before them (:mod:`astream._sampling.shuffle.nodes`). Where each
node's draws begin is kept in the node's cache (:mod:`astream._cache.plan_states`): the
node's first process walks, its other ranks and workers (and the next run of that epoch)
start at their own canonical node.
"""

from __future__ import annotations

from astream._cache.plan_states import load_plan_states, save_plan_states
from astream._coord.world import World
from astream._sampling.order import WorkerBatches, worker_batches
from astream._sampling.plan import EpochPlan

__all__ = ["worker_order"]


def worker_order(plan: EpochPlan, world: World, folder: str | None, worker: int, drop_last: bool) -> WorkerBatches:
    """Worker ``worker``'s batches of ``plan`` on this rank, the states kept in ``folder``
    taken first and those found added (``folder`` None: a local dataset's own folder, the
    user's data, where MosaicML writes nothing either: each process walks the draws itself)."""
    if folder is None or not plan.shuffle or plan.batching_method != "random":
        return worker_batches(plan, world.node, world.local_rank, worker, drop_last=drop_last)
    if not plan.node_states:
        plan.node_states.update(load_plan_states(folder, plan.shuffle_key))
    known = len(plan.node_states)
    order = worker_batches(plan, world.node, world.local_rank, worker, drop_last=drop_last)
    if len(plan.node_states) > known:
        save_plan_states(folder, plan.shuffle_key, plan.node_states)
    return order
