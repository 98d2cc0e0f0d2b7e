"""``NodeSession``: what one process holds to read a dataset — never pickled — and random access through it.

One node client per event loop (a loop's client is never shared with another loop),
the open shard readers, the sources for reading ahead of downloads, and the cache of
epoch plans. A dataset makes a fresh session in every process it is unpickled in.
"""

from __future__ import annotations

import asyncio
import threading
import weakref
from collections import OrderedDict
from collections.abc import Callable, Hashable
from concurrent.futures import Future
from typing import Any

import numpy as np

from astream._coord.client import AsyncNodeClient
from astream._dataset.config import DatasetConfig
from astream._dataset.layout import SampleMap
from astream._dataset.read.arriving import ArrivingShards
from astream._dataset.read.peek import RemotePeek
from astream._dataset.read.policy import SourcePolicy
from astream._dataset.read.ranged import RangedReader
from astream._dataset.read.reader import EpochReader
from astream._dataset.read.samples import SampleSteps
from astream._dataset.read.shards import OpenShards
from astream._dataset.read.sources import EarlySources
from astream._dataset.start.held import HeldClient
from astream._format.index import Index
from astream._node.provider import shard_key, view_of
from astream._sampling.order import WorkerBatches
from astream._sampling.plan import EpochPlan
from astream.errors import ShardFormatError

__all__ = ["NodeSession", "main_member"]

# Plans kept per process: a plan caches its epoch's shuffle, which every query of the
# epoch (len, batch_ids, the readers) shares; recomputing it costs tens of milliseconds.
_PLANS_KEPT = 4


def main_member(rank: int) -> str:
    """The name of a rank's own process at the node's barriers (workers are ``rank<r>.worker<w>``)."""
    return f"rank{rank}.main"


class NodeSession:
    """This process's node clients, open shards, read-ahead sources and plans.

    Args:
        network_peek: reads ahead of downloads may go over the network (off in loader
            worker processes, where importing the HTTP client costs more than it saves).
    """

    def __init__(self, config: DatasetConfig, indexes: list[Index], smap: SampleMap, *, network_peek: bool) -> None:
        self._config = config
        self._indexes = indexes
        self._smap = smap
        self._network_peek = network_peek
        self._clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, AsyncNodeClient] = (
            weakref.WeakKeyDictionary()
        )
        self.shards = OpenShards(smap)
        self._sources: SourcePolicy | None = None  # (worked out on first use)
        self._plans: OrderedDict[Hashable, EpochPlan] = OrderedDict()
        self._plans_lock = threading.Lock()
        self._view: str | None = None  # the dataset's identity at its node agent (see view_of)

    def plan(self, key: Hashable, build: Callable[[], EpochPlan]) -> EpochPlan:
        """The plan for ``key``, built once while it stays among the last few used."""
        with self._plans_lock:
            plan = self._plans.get(key)
            if plan is not None:
                self._plans.move_to_end(key)
                return plan
        plan = build()
        with self._plans_lock:
            self._plans[key] = plan
            while len(self._plans) > _PLANS_KEPT:
                self._plans.popitem(last=False)
        return plan

    async def node(self, worker: int = 0, workers_per_rank: int = 1, *, role: str = "main") -> AsyncNodeClient:
        """This process's client of the node agent for the running loop (joined on first use)."""
        loop = asyncio.get_running_loop()
        client = self._clients.get(loop)
        if client is None:
            # Registered before it connects, so concurrent callers share one client.
            client = self.client(worker, workers_per_rank, role=role)
            try:
                await client.aconnect()
            except BaseException:
                if self._clients.get(loop) is client:
                    del self._clients[loop]
                await client.aclose()
                raise
        return client

    def client(self, worker: int = 0, workers_per_rank: int = 1, *, role: str = "main",
               until: Future[None] | None = None) -> AsyncNodeClient:
        """This process's client for the running loop as it is: made and registered if there is
        none, not joined (it joins at its first call; :meth:`node` joins it at once); ``until``:
        its calls wait for it first (the prelude's batch 0: :mod:`astream._dataset.start.held`)."""
        loop = asyncio.get_running_loop()
        client = self._clients.get(loop)
        if client is None:
            client = self._clients[loop] = self.new_client(worker, workers_per_rank, role=role)
        if until is not None and isinstance(client, HeldClient):
            client.hold_until(until)
        return client

    def new_client(self, worker: int = 0, workers_per_rank: int = 1, *, role: str = "main") -> HeldClient:
        """A client of the node agent, not yet connected (``role``: ``"main"``, ``"worker"``,
        or ``"warm"``, the warm start's own: no party of any barrier)."""
        cfg = self._config
        world = cfg.unique_world.with_worker(worker, workers_per_rank)
        member = {"main": main_member(world.rank), "warm": f"rank{world.rank}.warm"}.get(role, world.member)
        factory = cfg.provider(self._indexes)
        if self._view is None:
            self._view = view_of(factory)
        return HeldClient(cfg.streams[0].local_dir, factory, run_id=cfg.run_id,
                          world=world, member=member, config=cfg.coord_config(), view=self._view)

    async def aclose(self) -> None:
        """Leave the node for the running loop; idempotent."""
        client = self._clients.pop(asyncio.get_running_loop(), None)
        if client is not None:
            await client.aclose()

    @property
    def sources(self) -> SourcePolicy:
        """Which early sources apply to each shard (see :mod:`astream._dataset.read.policy`), chosen once."""
        if self._sources is None:
            transfers = [spec.transfer_options() for spec in self._config.provider(self._indexes).streams]
            self._sources = SourcePolicy(self._smap, self._config.streams, transfers, network=self._network_peek)
        return self._sources

    def early_sources(self) -> EarlySources | None:
        """One reader's early sources (see :mod:`astream._dataset.read.sources`), or None: a
        bounded cache, skip mode, or a dataset none applies to."""
        cfg = self._config
        turns = self.sources.turns(bounded=cfg.cache_limit is not None, skips=cfg.bad_samples.skips)
        if turns is None:
            return None
        policy = turns.policy
        ranged = RemotePeek(self._smap, turns, RangedReader(policy.transfers)) if policy.any_ranged else None
        return EarlySources(turns, ranged, ArrivingShards(self._smap, turns) if policy.any_arriving else None)

    def reader(
        self, node: AsyncNodeClient, order: WorkerBatches, predownload: int, steps: SampleSteps | None = None,
        batch_transform: Callable[[Any], Any] | None = None, window: int = 1, skipped: frozenset[int] = frozenset(),
    ) -> EpochReader:
        """A reader of ``order`` through this process's open shards (use ``async with``);
        ``skipped``: with ``on_bad_sample="skip"``, the ids known to be bad."""
        policy = self._config.bad_samples
        return EpochReader(node, self._smap, order, predownload, self._config.max_concurrency, self.shards,
                           early=self.early_sources(), steps=steps, batch_transform=batch_transform,
                           bounded=self._config.cache_limit is not None, window=window,
                           bad_samples=(policy, skipped) if policy.skips else None)

    async def read_sample(self, index: int) -> dict[str, Any]:
        """Sample ``index`` (checked) as stored, its shard pinned while it is read."""
        shard, offset = self._smap.locate_one(index)
        node = await self.node()
        key = shard_key(self._smap.shard_stream[shard], self._smap.shard_local[shard])
        path = await node.ensure(key, pin=True)
        try:
            try:
                return self.shards.get(shard, path).get(offset)
            except ShardFormatError:  # its file may be gone since the node installed it
                return self.shards.get(shard, await node.refetch(key)).get(offset)
        finally:
            await node.unpin(key)

    async def read_batch(self, ids: np.ndarray, steps: SampleSteps | None) -> dict[str, Any]:
        """Samples ``ids`` (checked) as one batch, through a reader of their own."""
        order = WorkerBatches.of(ids, max(1, len(ids)))
        async with EpochReader(await self.node(), self._smap, order, len(ids), self._config.max_concurrency,
                               self.shards, steps=steps, bounded=self._config.cache_limit is not None,
                               window=max(1, len(ids))) as reader:
            batches = [b async for b in reader.batches()]
        return batches[0] if batches else {}
