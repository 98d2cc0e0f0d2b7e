"""The epoch plans of one dataset, and the batches they start with.

:class:`Planner` turns the dataset's configuration, its run state (canonical nodes, seed,
first run's nodes, a changed mixture's history) and its sample map into an
:class:`~astream._sampling.plan.EpochPlan`, kept in the process's
:class:`~astream._dataset.session.NodeSession` (a plan caches its epoch's shuffle, which
``len``, ``batch_ids`` and every reader of the epoch share). It owns no state of its own:
every value it reads has its owner (``DatasetConfig``, ``RunState``, ``NodeSession``), and it
holds no reference to the dataset, so the start-up prelude may keep it
(:mod:`astream._dataset.start.prelude`) without keeping the dataset alive.
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
import numpy.typing as npt

from astream._dataset.config import DatasetConfig
from astream._dataset.layout import SampleMap
from astream._dataset.run import RunState
from astream._dataset.session import NodeSession
from astream._dataset.shared_plan import worker_order
from astream._node.provider import shard_key
from astream._sampling.order import WorkerBatches, first_batch
from astream._sampling.plan import EpochPlan

__all__ = ["Planner", "ReaderShape"]

Int64Array = npt.NDArray[np.int64]


class ReaderShape(NamedTuple):
    """The readers of a loader, as their first batches depend on them."""

    readers: int  # per rank (a loader's workers, or its one reader)
    batch_size: int
    drop_last: bool


class Planner:
    """The plans of one dataset in this process (see the module's docstring)."""

    def __init__(self, config: DatasetConfig, run: RunState, smap: SampleMap, session: NodeSession) -> None:
        self._config = config
        self._run = run
        self._smap = smap
        self._session = session

    def plan(self, *, epoch: int, sample_in_epoch: int, workers_per_rank: int, batch_size: int | None = None) -> EpochPlan:
        """The epoch plan for this dataset, world and run state (``batch_size``: a loader's, used
        only when the dataset has none)."""
        cfg, run = self._config, self._run
        ncn = run.ncn if run.ncn is not None else cfg.num_canonical_nodes
        size = cfg.batch_size or batch_size or 1
        history = run.history_of(epoch, sample_in_epoch)  # an epoch whose mixture changed: its current segment's plan
        key = (epoch, sample_in_epoch, workers_per_rank, size, ncn, run.seed, run.initial_physical_nodes,
               history and history[1])
        return self._session.plan(key, lambda: cfg.epoch_plan(
            self._smap.stream_shard_sizes(), num_canonical_nodes=ncn, shuffle_seed=run.seed,
            initial_physical_nodes=run.initial_physical_nodes, epoch=epoch, sample_in_epoch=sample_in_epoch,
            workers_per_rank=workers_per_rank, batch_size=size, history=history,
        ))

    def plan_at(self, epoch: int, sample_in_epoch: int) -> EpochPlan:
        """The plan of one reader per rank (what a loaded state is checked against)."""
        return self.plan(epoch=epoch, sample_in_epoch=sample_in_epoch, workers_per_rank=1)

    def worker_order(self, plan: EpochPlan, worker: int, drop_last: bool) -> WorkerBatches:
        """Worker ``worker``'s batches of ``plan`` on this rank (kept on the plan)."""
        first = self._config.streams[0]  # (a local dataset's own folder is the user's data: nothing kept there)
        return worker_order(plan, self._config.world, first.local_dir if first.remote is not None else None, worker,
                            drop_last)

    def reader_order(self, shape: ReaderShape, epoch: int, sample_in_epoch: int) -> None:
        """Compute (and keep on the plan) the order of a loader's only reader, if it has one."""
        if shape.readers == 1:
            plan = self.plan(epoch=epoch, sample_in_epoch=sample_in_epoch, workers_per_rank=1,
                             batch_size=shape.batch_size)
            self.worker_order(plan, 0, shape.drop_last)

    def first_ids(self, shape: ReaderShape, epoch: int, sample_in_epoch: int) -> list[Int64Array]:
        """The global sample ids of the first batch of each of this rank's readers in ``epoch``
        from ``sample_in_epoch`` (batch 0 of each reader's order, computed alone where the plan allows)."""
        plan = self.plan(epoch=epoch, sample_in_epoch=sample_in_epoch, workers_per_rank=shape.readers,
                         batch_size=shape.batch_size)
        world = self._config.world
        return [first_batch(plan, world.node, world.local_rank, worker, drop_last=shape.drop_last)
                for worker in range(shape.readers)]

    def first_keys(self, shape: ReaderShape, epoch: int, sample_in_epoch: int = 0) -> list[str]:
        """The shards (keys) of the first batch of each of this rank's readers in ``epoch``
        from ``sample_in_epoch``, those of streams with a remote, in the order they are read."""
        shards = self._smap.locate(np.concatenate(self.first_ids(shape, epoch, sample_in_epoch)))[0]
        found, at = np.unique(shards, return_index=True)
        streams = self._config.streams
        out = []
        for g in found[np.argsort(at)].tolist():
            stream = self._smap.shard_stream[g]
            if streams[stream].remote is not None:
                out.append(shard_key(stream, self._smap.shard_local[g]))
        return out
