"""``Loader``: batches from a :class:`StreamingDataset`, sync or async, with workers.

One async core: ``async for batch in loader`` runs it on the caller's loop, ``for
batch in loader`` runs the same code on astream's loop thread and receives whole
batches through a bounded queue. With ``num_workers > 0`` each worker (a process, or
a thread) reads its share of the epoch plan and the loader merges their batches
round-robin — the order a torch DataLoader gives over MosaicML Streaming — so
``state_dict()`` and resumption mean exactly what they mean there.
"""

from __future__ import annotations

import asyncio
import sys
import threading
import time
import weakref
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from typing import Any

import numpy as np

from astream._dataset import quarantine as bad
from astream._dataset.bridge import SyncIterator
from astream._dataset.dataset import StreamingDataset
from astream._dataset.epoch_job import EpochJob, open_reader, pickled_for_workers
from astream._dataset.handed import Handed
from astream._dataset.iteration import ManagedAsyncIterator
from astream._dataset.loader_config import BatchTransform, Collate, LoaderConfig
from astream._dataset.observe.metrics import register as register_metrics
from astream._dataset.observe.prometheus import enable_from_env as enable_prometheus_from_env
from astream._dataset.observe.stats import Stats
from astream._dataset.planner import ReaderShape
from astream._dataset.runtime import portal
from astream._dataset.workers.autowatch import CostWatch
from astream._dataset.workers.autoworkers import WorkerChoice
from astream._dataset.workers.crew import Crew
from astream._dataset.workers.pool import WorkerPool
from astream._dataset.workers.startup import WorkerStart, decide_start, prestart, process_context
from astream._sampling.order import batch_counts, rank_batches, round_robin
from astream._storage.loop import new_event_loop
from astream.errors import ConfigError

__all__ = ["Loader"]

class Loader:
    """Batches of a :class:`StreamingDataset` for this rank, in MosaicML Streaming's order.

    Args:
        dataset: the dataset.
        batch_size: samples per batch; default the dataset's ``batch_size``.
        num_workers: worker processes (or threads) reading in parallel; 0 reads in the
            iterating process; ``"auto"``: the first epoch without workers, then the
            count chosen from the cores and what its first batches cost
            (:mod:`astream._dataset.workers.autoworkers` has the rule; ``worker_choice`` shows
            it once made; ``len(loader)`` follows the count). A worker process's large arrays (64 KiB and more) reach
            the loop as views of shared memory the worker reuses only once every array
            of that batch is gone: a batch stays valid (and writable) as long as it is
            held; holding many keeps their memory, and the worker sends the next ones
            in fresh memory meanwhile.
        collate_fn: turns a list of sample dicts into a batch; default: a dict of NumPy
            arrays read column-wise (lists for str/bytes/ragged columns).
        drop_last: drop each worker's last, incomplete batch.
        prefetch_batches: batches each worker (or the reader) keeps ready ahead, at
            least: small batches are queued deeper while a queue holds under 8 MiB (up to
            64 batches), because every batch costs a thread wake-up on its way.
        worker_mode: ``"process"`` (started with forkserver/spawn, never fork) or ``"thread"``.
        batch_transform: applied to each collated batch, in the worker that made it.
        persistent_workers: keep worker processes from one epoch (and one ``for`` over
            the loader) to the next; each new epoch is sent to the running workers.
            They stop at ``close()``, at the end of ``with``, or when the loader is
            garbage collected. An epoch left early starts new workers for the next.
        progress: show a tqdm bar of each iteration's samples, with samples/s and the
            share of the time the loop waited for data (``stall``).

    Raises:
        ConfigError: no batch size anywhere, or a bad parameter.
    """

    def __init__(
        self,
        dataset: StreamingDataset,
        batch_size: int | None = None,
        num_workers: int | str = 0,
        collate_fn: Collate | None = None,
        drop_last: bool = False,
        prefetch_batches: int = 2,
        worker_mode: str = "process",
        batch_transform: BatchTransform | None = None,
        persistent_workers: bool = True,
        progress: bool = False,
    ) -> None:
        if not isinstance(dataset, StreamingDataset):
            raise ConfigError(f"Loader needs an astream StreamingDataset, got {type(dataset).__name__}")
        config = LoaderConfig.of(dataset.batch_size, batch_size, num_workers, collate_fn, drop_last,
                                 prefetch_batches, worker_mode, batch_transform, persistent_workers, progress)
        self.config = config
        self._watch: CostWatch | None = CostWatch() if config.auto_workers else None  # "auto": the first epoch's costs
        self._choice: WorkerChoice | None = None
        self._auto_blocked: str | None = None  # why "auto" may not choose workers here
        self._worker_start = WorkerStart()
        self._crew: Crew | None = None
        self._prestart: threading.Timer | None = None
        if config.processes and (config.num_workers > 0 or self._watch is not None):
            # Decided here, where the caller's frames are on the stack (iteration runs on
            # astream's loop thread): a script without a main guard (startup.py). For "auto", the
            # same checks for the workers it may choose: what fails them keeps it at 0.
            try:
                parts = pickled_for_workers(dataset, collate_fn=config.collate_fn,
                                             batch_transform=config.batch_transform)
                self._worker_start = decide_start(parts, sys._getframe(1))
            except ConfigError as exc:
                if self._watch is None:
                    raise
                self._auto_blocked = str(exc).split("\n")[0]
        self.dataset = dataset
        self._book = bad.QuarantineBook.of(dataset.config.bad_samples, dataset.unique_world.rank)  # (skip)
        self._handed = Handed(config.progress, self._book, self._watch)  # what the caller received
        register_metrics(self)  # a weak reference, read only by an exporter someone enabled
        enable_prometheus_from_env(dataset.world.local_rank)
        # Iterations in progress, for close(); an abandoned one drops out when collected.
        self._open_sync: weakref.WeakSet[SyncIterator[Any]] = weakref.WeakSet()
        self._open_async_iterations: weakref.WeakSet[ManagedAsyncIterator[Any]] = weakref.WeakSet()
        if config.num_workers > 0 and config.processes:
            # Join the node now, in the background (the agent starts if this is the first
            # process there: a process of its own when several ranks share the node), so
            # that it happens while the caller builds the model instead of before the
            # first batch. Failures surface at iteration. The forkserver starts now too.
            portal().submit(dataset.node())
            self._prestart = prestart(process_context(EpochJob.__module__, self._worker_start))
        if (config.num_workers > 0 or self._watch is not None) and config.processes and config.persistent_workers:
            self._crew = Crew()
            # The processes and their pipes go with the loader at the latest, never
            # with the collection of their objects.
            weakref.finalize(self, self._crew.close)
        # The first batches of this loader's readers start downloading now, while the
        # caller builds its model (a hint: see astream._dataset.start.prelude).
        self._prelude = dataset.prelude(ReaderShape(config.readers, config.batch_size, config.drop_last))

    # -- the configuration, as attributes (read-only: the config is frozen) ------------------

    @property
    def batch_size(self) -> int:
        """Samples per batch."""
        return self.config.batch_size

    @property
    def num_workers(self) -> int:
        """Worker count of the next epoch (``"auto"``: 0 until it chose)."""
        return self.config.num_workers

    @property
    def collate_fn(self) -> Collate | None:
        """The function turning a list of samples into a batch, if any."""
        return self.config.collate_fn

    @property
    def drop_last(self) -> bool:
        """Whether each worker's last, incomplete batch is dropped."""
        return self.config.drop_last

    @property
    def prefetch_batches(self) -> int:
        """Batches each worker (or the reader) keeps ready ahead, at least."""
        return self.config.prefetch_batches

    @property
    def worker_mode(self) -> str:
        """``"process"`` or ``"thread"``."""
        return self.config.worker_mode

    @property
    def batch_transform(self) -> BatchTransform | None:
        """Applied to each collated batch, in the worker that made it."""
        return self.config.batch_transform

    @property
    def progress(self) -> bool:
        """Whether a progress bar shows each iteration."""
        return self.config.progress

    # -- the async core ----------------------------------------------------------------------

    @property
    def worker_choice(self) -> WorkerChoice | None:
        """What ``num_workers="auto"`` chose and from what (None before it chose, or without "auto")."""
        return self._choice

    def _choose_workers(self) -> None:
        """``num_workers="auto"``: fix the count from the first epoch's costs, once."""
        watch = self._watch
        if watch is None or self._choice is not None or not watch.ready():
            return
        self._choice = watch.choice(self.dataset.world.ranks_per_node, self._auto_blocked)
        self.config = self.config.with_workers(self._choice.workers)
        self._handed.watch = None  # (chosen: its figures are not needed any more)

    @property
    def num_samples_yielded(self) -> int:
        """Samples this iteration handed out so far (MosaicML's attribute; ``state_dict`` reads it)."""
        return self._handed.samples

    @num_samples_yielded.setter
    def num_samples_yielded(self, value: int) -> None:
        self._handed.samples = value

    @asynccontextmanager
    async def _open_epoch(self, count: bool = True) -> AsyncIterator[AsyncIterator[Any]]:
        """The epoch's batches: where the start-up prelude has a loaded position's batch 0 ready,
        the reader reads it before the node is joined (start/prelude.py), else after the join."""
        if self._prestart is not None:
            self._prestart.cancel()  # iterating already: the first batch goes first
        self._choose_workers()  # before the epoch begins: the count is the epoch's
        ds, config, prelude = self.dataset, self.config, self._prelude
        self.num_samples_yielded = 0
        first = None if prelude is None else await prelude.first_position(
            ReaderShape(config.readers, config.batch_size, config.drop_last), config.collate_fn)
        try:
            if first is None:
                epoch, offset = await self._join()
            else:
                ds.session.client(until=first.read)  # this loop's (the barrier's party): it joins after batch 0
                epoch, offset = first.epoch, first.offset
            if self.progress:
                self._handed.epoch_samples = sum(len(b) for b in self.batch_ids(epoch, offset))
            skipped = bad.epoch_skips(self._book, offset, lambda: config.batch_size * len(self.batch_ids(epoch)))
            if config.num_workers == 0:
                async with open_reader(ds, epoch, offset, 0, config, skipped, joined=first is None) as reader:
                    batches = reader.batches(config.collate_fn)
                    if first is not None:
                        assert prelude is not None
                        batches = prelude.first_batch(first, batches, self._join)
                    yield self._handed.counted(batches) if count else batches
                return
            job = EpochJob(ds, epoch, offset, config, skipped)
            plan = ds.plan(epoch=epoch, sample_in_epoch=offset, workers_per_rank=config.num_workers,
                           batch_size=config.batch_size)
            schedule = round_robin(batch_counts(plan, ds.world.node, ds.world.local_rank, drop_last=config.drop_last))
            async with WorkerPool(job, config.num_workers, config.worker_mode, config.prefetch_batches,
                                  loop_factory=new_event_loop, schedule=schedule.tolist(),
                                  start=self._worker_start, crew=self._crew) as pool:
                yield self._handed.counted(pool.batches()) if count else pool.batches()
        finally:
            if first is not None:
                first.release()  # (batch 0 released it already, unless it was never read)

    async def _join(self) -> tuple[int, int]:
        """Join the node and begin the epoch with its ranks: (epoch, offset)."""
        ds = self.dataset
        return await ds.begin_epoch(await ds.node(), readers_per_rank=self.config.readers)

    def __aiter__(self) -> ManagedAsyncIterator[Any]:
        """``async for batch in loader``: this rank's batches of the next epoch."""
        iteration: ManagedAsyncIterator[Any] = ManagedAsyncIterator(self._open_epoch())
        self._open_async_iterations.add(iteration)
        return iteration

    def __iter__(self) -> Iterator[Any]:
        """``for batch in loader``: the same batches, through astream's loop thread."""
        # Counted here, as the caller receives each batch, not when the loop thread made it.
        self.num_samples_yielded = 0
        last = time.perf_counter()
        batches = SyncIterator(portal(), lambda: self._open_epoch(count=False), maxsize=self.prefetch_batches)
        self._open_sync.add(batches)
        try:
            while True:
                asked = time.perf_counter()
                try:
                    batch = next(batches)
                except StopIteration:
                    return
                batch, last = self._handed.take(batch, asked, last)
                yield batch
        finally:
            batches.close()
            self._handed.end()

    async def astats(self) -> Stats:
        """The node's cache figures and this loader's (batches, samples, time its consumer waited)."""
        if self._crew is not None:
            # Kept workers may still be sending their last epoch's stage times (they were
            # starting while the stand-ins served it): wait for them (bounded), so figures
            # read after an epoch include all of it. Off the loop: their readers need it.
            await asyncio.to_thread(self._crew.settle)
        return Stats.of(await (await self.dataset.node()).stats(), self._handed.consumer.copy(),
                        self.dataset.mixture_report(), self._book)

    def stats(self) -> Stats:
        """:meth:`astats` from sync code (e.g. a training loop logging every N steps)."""
        return portal().call(self.astats())

    def _own_stats(self) -> Stats:
        """This loader's figures without the node's (metrics, when the node cannot be asked)."""
        return Stats.of({}, self._handed.consumer.copy())

    def _metric_place(self) -> tuple[int, int]:
        """This process's rank and node, as the metrics label them."""
        world = self.dataset.world
        return world.rank, world.node

    # -- closing -----------------------------------------------------------------------------

    def close(self) -> None:
        """Stop this loader's iterations in progress and its worker processes (kept between epochs).

        The loader stays usable (the next ``for`` starts a new epoch as usual) and the
        dataset stays open; ``dataset.close()`` leaves the node. Iterations that end or are
        garbage collected release the same resources by themselves; this is for stopping
        early and deterministically, e.g. ``with Loader(ds, num_workers=4) as loader:``.
        An ``async for`` in progress on a running loop is closed there: prefer
        ``await loader.aclose()`` from async code, which waits for it.
        """
        if self._prestart is not None:
            self._prestart.cancel()
        for batches in list(self._open_sync):
            batches.close()
        for iteration in list(self._open_async_iterations):
            iteration.close_soon()
        if self._crew is not None:
            self._crew.close()

    async def aclose(self) -> None:
        """:meth:`close`, waiting for the ``async for`` iterations of the running loop to end."""
        loop = asyncio.get_running_loop()
        mine = [it for it in list(self._open_async_iterations) if it.loop in (None, loop)]
        for iteration in mine:
            await iteration.aclose()
        others = [it for it in list(self._open_async_iterations) if it not in mine]
        for iteration in others:
            iteration.close_soon()
        for batches in list(self._open_sync):
            await asyncio.to_thread(batches.close)
        if self._crew is not None:
            await asyncio.to_thread(self._crew.close)

    def __enter__(self) -> Loader:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    async def __aenter__(self) -> Loader:
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def __len__(self) -> int:
        """Batches this rank yields per epoch (with this loader's workers and drop_last)."""
        return len(self.batch_ids(self.dataset.current_epoch))

    def batch_ids(self, epoch: int, sample_in_epoch: int = 0) -> list[np.ndarray]:
        """The global sample ids of each batch this rank's loader yields in ``epoch``.

        The same batches, in the same order, as iterating the loader (workers merged
        round-robin), starting ``sample_in_epoch`` samples (all ranks) into the epoch.
        Adapters that fetch batches by index (Keras ``PyDataset``) use this with
        ``dataset.get_batch``.
        """
        ds = self.dataset
        plan = ds.plan(epoch=epoch, sample_in_epoch=sample_in_epoch, workers_per_rank=self.config.readers,
                       batch_size=self.batch_size)
        return rank_batches(plan, ds.world.node, ds.world.local_rank, drop_last=self.drop_last)

    # -- resumption --------------------------------------------------------------------------

    def state_dict(self) -> dict[str, Any]:
        """The state to resume from: MosaicML StreamingDataLoader's keys plus a fingerprint.

        ``sample_in_epoch`` counts samples of all ranks: what this loader handed out times
        the number of ranks (divided by ``replication``), as MosaicML computes it.
        """
        world = self.dataset.unique_world
        consumed = self.num_samples_yielded * world.world_size
        if self.dataset.replication:
            consumed //= self.dataset.replication
        return bad.with_quarantine(self.dataset.state_dict(consumed, from_beginning=False), self._book)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume mid-epoch at the next iteration (also on another world shape).

        Raises:
            StateError: the state does not fit this dataset or world.
        """
        self.dataset.load_state_dict(state)
        self.num_samples_yielded = 0
        bad.load_quarantine(self._book, state, self.dataset.sample_map.shard_file)

