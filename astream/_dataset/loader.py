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
import copy
import pickle
import sys
import threading
import time
import weakref
from collections.abc import AsyncIterator, Iterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np

from astream._dataset import quarantine as bad
from astream._dataset.bridge import SyncIterator
from astream._dataset.dataset import StreamingDataset
from astream._dataset.iteration import ManagedAsyncIterator
from astream._dataset.loader_config import BatchTransform, Collate, LoaderConfig
from astream._dataset.observe.metrics import register as register_metrics
from astream._dataset.observe.progress import ProgressBar
from astream._dataset.observe.prometheus import enable_from_env as enable_prometheus_from_env
from astream._dataset.observe.stats import ConsumerCounters, Stats
from astream._dataset.observe.timings import STAGES
from astream._dataset.read.reader import EpochReader, StartAt
from astream._dataset.read.samples import apply_batch_transform
from astream._dataset.runtime import portal
from astream._dataset.start.early import EarlyBatch, EarlyFirst, ServedFirst, check_began
from astream._dataset.workers.autowatch import CostWatch
from astream._dataset.workers.autoworkers import WorkerChoice
from astream._dataset.workers.crew import Crew
from astream._dataset.workers.pool import WorkerPool
from astream._dataset.workers.startup import WorkerStart, decide_start, prestart, process_context
from astream._sampling.order import batch_counts, rank_batches, round_robin
from astream._storage.loop import new_event_loop
from astream.errors import ConfigError

__all__ = ["Loader"]

def batch_length(batch: Any) -> int:
    """Samples in a batch: a dict's first column, a sequence, or an array's first axis."""
    if isinstance(batch, dict):
        if not batch:
            return 0
        return batch_length(next(iter(batch.values())))
    if isinstance(batch, np.ndarray):
        return int(batch.shape[0]) if batch.ndim else 1
    if hasattr(batch, "shape") and getattr(batch, "shape", None):
        return int(batch.shape[0])
    try:
        return len(batch)
    except TypeError:
        return 1


@dataclass
class _EpochJob:
    """What each loader worker runs: its share of one epoch (picklable)."""

    dataset: StreamingDataset
    epoch: int
    offset: int
    config: LoaderConfig
    skipped: frozenset[int] = frozenset()  # on_bad_sample="skip": ids known to be bad, never read
    # While worker processes start, the consumer reads their first batches itself (see
    # WorkerPool): the first batch no longer waits for interpreters to boot.
    stand_in: ClassVar[bool] = True

    @asynccontextmanager
    async def open(self, worker_id: int, start_at: StartAt | None = None) -> AsyncIterator[AsyncIterator[Any]]:
        # Thread workers share the process: each gets its own copy of the dataset so open
        # shards and node clients are never shared between event loops.
        ds = self.dataset if self.config.processes else _thread_copy(self.dataset)
        try:
            async with _open_reader(ds, self.epoch, self.offset, worker_id, self.config, self.skipped) as reader:
                yield reader.batches(self.config.collate_fn, start_at=start_at)
        finally:
            await ds.aclose()
            # This worker's dataset is its own (a thread's copy, or unpickled with the job by
            # a stand-in or a worker process): its shard maps hold file descriptors, which
            # must not wait for the garbage collector (an epoch would leak dozens).
            ds.session.shards.close()


def _open_reader(
    ds: StreamingDataset, epoch: int, offset: int, worker: int, config: LoaderConfig,
    skipped: frozenset[int] = frozenset(),  # on_bad_sample="skip": the ids known to be bad
) -> AbstractAsyncContextManager[EpochReader]:
    """The reader of one of the loader's readers (a worker's, or the process's own)."""
    return ds.open_epoch_reader(epoch, offset, worker=worker, workers_per_rank=config.readers,
                                batch_size=config.batch_size, drop_last=config.drop_last,
                                batch_transform=config.batch_transform, skipped=skipped)


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
                parts = _pickled_for_workers(dataset, collate_fn=config.collate_fn,
                                             batch_transform=config.batch_transform)
                self._worker_start = decide_start(parts, sys._getframe(1))
            except ConfigError as exc:
                if self._watch is None:
                    raise
                self._auto_blocked = str(exc).split("\n")[0]
        self.dataset = dataset
        self.num_samples_yielded = 0
        self._consumer = ConsumerCounters()  # over the loader's life, all epochs
        self._bar: ProgressBar | None = None
        self._epoch_samples: int | None = None  # this iteration's, for the bar
        self._book = bad.QuarantineBook.of(dataset.config.bad_samples, dataset.unique_world.rank)  # (skip)
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
            self._prestart = prestart(process_context(_EpochJob.__module__, self._worker_start))
        if (config.num_workers > 0 or self._watch is not None) and config.processes and config.persistent_workers:
            self._crew = Crew()
            # The processes and their pipes go with the loader at the latest, never
            # with the collection of their objects.
            weakref.finalize(self, self._crew.close)
        # The first batches of this loader's readers start downloading now, while the
        # caller builds its model (a hint: see astream._dataset.start.warmup).
        dataset.warm_up(config.readers, config.batch_size, config.drop_last)

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

    def _received(self, batch: Any, asked: float, last: float, cpu_waited: float = 0.0) -> float:
        # Counted as it is handed over, i.e. what the training loop received.
        now = time.perf_counter()
        if self._watch is not None and self._choice is None:
            self._watch.received(batch, now - asked, cpu_waited)
        n = batch_length(batch)
        self.num_samples_yielded += n
        self._consumer.received(n, now - asked, now - last)
        if self.progress:
            if self._bar is None:
                self._bar = ProgressBar(self._consumer, self._epoch_samples)
            self._bar.update(n)
        return now

    def _end_bar(self) -> None:
        bar, self._bar = self._bar, None
        if bar is not None:
            bar.close()

    async def _counted(self, batches: AsyncIterator[Any]) -> AsyncIterator[Any]:
        it = batches.__aiter__()
        if self._watch is not None:
            self._watch.started()  # the first epoch's start (a no-op after it)
        last = time.perf_counter()
        try:
            while True:
                asked, cpu = time.perf_counter(), time.thread_time()
                try:
                    batch = await it.__anext__()
                except StopAsyncIteration:
                    return
                batch = bad.handed(self._book, batch) if type(batch) is bad.Substituted else batch
                last = self._received(batch, asked, last, time.thread_time() - cpu)
                yield batch
        finally:
            self._end_bar()

    @asynccontextmanager
    async def _open_epoch(self, count: bool = True,
                          served: ServedFirst | None = None) -> AsyncIterator[AsyncIterator[Any]]:
        """The epoch's batches; ``served``: its first was handed out already (see _early_first)."""
        if self._prestart is not None:
            self._prestart.cancel()  # iterating already: the first batch goes first
        self._choose_workers()  # before the epoch begins: the count is the epoch's
        ds = self.dataset
        node = await ds.node()
        config = self.config
        epoch, offset = await ds.begin_epoch(node, readers_per_rank=config.readers)
        if served is None:
            self.num_samples_yielded = 0
        else:
            check_began(served, epoch, offset)
        if self.progress:
            self._epoch_samples = sum(len(b) for b in self.batch_ids(epoch, offset))
        skipped = bad.epoch_skips(self._book, offset, lambda: config.batch_size * len(self.batch_ids(epoch)))
        if config.num_workers == 0:
            async with _open_reader(ds, epoch, offset, 0, config, skipped) as reader:
                batches = reader.batches(config.collate_fn, served_first=None if served is None else served.served)
                yield self._counted(batches) if count else batches
            return
        assert served is None  # (taken only without workers)
        job = _EpochJob(ds, epoch, offset, config, skipped)
        plan = ds.plan(epoch=epoch, sample_in_epoch=offset, workers_per_rank=config.num_workers,
                       batch_size=config.batch_size)
        schedule = round_robin(batch_counts(plan, ds.world.node, ds.world.local_rank, drop_last=config.drop_last))
        async with WorkerPool(job, config.num_workers, config.worker_mode, config.prefetch_batches,
                              loop_factory=new_event_loop, schedule=schedule.tolist(),
                              start=self._worker_start, crew=self._crew) as pool:
            yield self._counted(pool.batches()) if count else pool.batches()

    @asynccontextmanager
    async def _open_async(self) -> AsyncIterator[AsyncIterator[Any]]:
        """``async for``'s batches: a resume's first taken early where that applies (as
        ``for`` does), the iteration starting once it is handed out."""
        first = self._early_first()
        early = None if first is None else await first.atake()
        if early is None:
            async with self._open_epoch() as batches:
                yield batches
            return
        self.num_samples_yielded = 0
        yield self._after_early(early)

    async def _after_early(self, early: EarlyBatch) -> AsyncIterator[Any]:
        # Closed by the ManagedAsyncIterator that iterates it (its iteration's context with it).
        batch, _ = self._handed_early(early, time.perf_counter(), time.perf_counter())
        served = early.served
        del early
        yield batch
        async with self._open_epoch(served=served) as rest:
            async for batch in rest:
                yield batch

    def __aiter__(self) -> ManagedAsyncIterator[Any]:
        """``async for batch in loader``: this rank's batches of the next epoch."""
        iteration: ManagedAsyncIterator[Any] = ManagedAsyncIterator(self._open_async())
        self._open_async_iterations.add(iteration)
        return iteration

    def __iter__(self) -> Iterator[Any]:
        """``for batch in loader``: the same batches, through astream's loop thread."""
        # Counted here, as the caller receives each batch, not when the loop thread made it.
        self.num_samples_yielded = 0
        last = asked = time.perf_counter()
        first = self._early_first()
        early = None if first is None else first.take()
        served = None if early is None else early.served
        batches = SyncIterator(portal(), lambda: self._open_epoch(count=False, served=served),
                               maxsize=self.prefetch_batches)
        self._open_sync.add(batches)
        try:
            if early is not None:
                batch, last = self._handed_early(early, asked, last)
                del early  # (the iteration holds what it needs of it)
                yield batch
            while True:
                asked = time.perf_counter()
                try:
                    batch = next(batches)
                except StopIteration:
                    return
                batch = bad.handed(self._book, batch) if type(batch) is bad.Substituted else batch
                last = self._received(batch, asked, last)
                yield batch
        finally:
            batches.close()
            self._end_bar()

    def _early_first(self) -> EarlyFirst | None:
        """A resume's first batch, to take from the row groups decoded at ``load_state_dict``
        before the iteration joins the node (:mod:`astream._dataset.start.early`); None where that
        does not apply: the iteration then reads it."""
        self._choose_workers()  # (the count this iteration runs with)
        if self.num_workers or self.collate_fn is not None:
            return None
        return self.dataset.early_first_batch(self.batch_size, self.drop_last)

    def _handed_early(self, early: EarlyBatch, asked: float, last: float) -> tuple[Any, float]:
        """The early batch as the caller receives it (its batch transform applied), counted."""
        if self.progress:
            self._epoch_samples = sum(len(b) for b in self.batch_ids(early.served.epoch, early.served.offset))
        batch = early.batch if self.batch_transform is None else \
            STAGES.call("transform", apply_batch_transform, self.batch_transform, early.batch)
        return batch, self._received(batch, asked, last)

    async def astats(self) -> Stats:
        """The node's cache figures and this loader's (batches, samples, time its consumer waited)."""
        if self._crew is not None:
            # Kept workers may still be sending their last epoch's stage times (they were
            # starting while the stand-ins served it): wait for them (bounded), so figures
            # read after an epoch include all of it. Off the loop: their readers need it.
            await asyncio.to_thread(self._crew.settle)
        return Stats.of(await (await self.dataset.node()).stats(), self._consumer.copy(),
                        self.dataset.mixture_report(), self._book)

    def stats(self) -> Stats:
        """:meth:`astats` from sync code (e.g. a training loop logging every N steps)."""
        return portal().call(self.astats())

    def _own_stats(self) -> Stats:
        """This loader's figures without the node's (metrics, when the node cannot be asked)."""
        return Stats.of({}, self._consumer.copy())

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


def _pickled_for_workers(dataset: StreamingDataset, **functions: Any) -> bytes:
    """The dataset and the loader's functions as worker processes get them (one pickling);
    what cannot travel is refused now, named, with the fix, instead of a PicklingError at
    the first epoch."""
    try:
        return pickle.dumps((dataset, *functions.values()))
    except Exception as first:
        # Name the culprit: the dataset's transform, a loader function, or the dataset (a
        # subclass may hold what does not pickle).
        named: dict[str, Any] = {"transform": dataset.config.transform, **functions, "the dataset": dataset}
        for name, fn in named.items():
            if fn is None:
                continue
            try:
                pickle.dumps(fn)
            except Exception as exc:
                what = name if name == "the dataset" else f"{name}={getattr(fn, '__qualname__', fn)!r}"
                raise ConfigError(
                    f"{what} cannot be pickled ({type(exc).__name__}: {exc}), so it cannot reach worker "
                    "processes; define it at module level (not a lambda or a nested function), or use "
                    "worker_mode='thread' or num_workers=0"
                ) from exc
        raise ConfigError(f"the loader's job cannot be pickled for worker processes: {first}") from first


def _thread_copy(dataset: StreamingDataset) -> StreamingDataset:
    """The dataset for a thread worker: the same configuration (not pickled: a thread needs
    no picklable transform), its own run state and process session."""
    clone = copy.copy(dataset)
    state = dataset.__getstate__()
    state["run"] = copy.deepcopy(dataset.run)
    clone.__setstate__(state)
    return clone
