"""The worker pool: workers (processes or threads) each produce one worker's batches.

Each worker runs a picklable :class:`~astream._dataset.workers.job.WorkerJob` for its worker id
on an event loop of its own and hands whole batches back; the pool yields them in the
order the epoch plan gives (``schedule``, from :mod:`astream._sampling.order`): batch 0
of worker 0, batch 0 of worker 1, ..., then batch 1 of worker 0, skipping workers that
have finished — exactly the order a torch DataLoader gives over MosaicML Streaming.

This module merges and closes; starting processes and carrying their messages is
:mod:`astream._dataset.workers.spawn`, and the stand-ins that serve a worker's first batches
while its process starts are :mod:`astream._dataset.workers.handoff`. A worker that raises sends
its traceback; one that dies is noticed by its pipe closing. Either way the consumer
gets a :class:`WorkerError`, never a hang.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import pickle
import threading
from collections.abc import AsyncIterator, Callable, Sequence
from typing import Any

from astream._dataset.depth import queue_depth
from astream._dataset.loader_config import WORKER_MODES
from astream._dataset.workers.crew import Crew
from astream._dataset.workers.handoff import StandIns
from astream._dataset.workers.job import WorkerJob, produce
from astream._dataset.workers.spawn import ProcessWorker
from astream._dataset.workers.startup import WorkerStart, process_context
from astream._resource import AsyncResource
from astream.errors import ConfigError, WorkerError

__all__ = ["WORKER_MODES", "WorkerJob", "WorkerPool"]

_END = object()  # a worker's "end" message, as returned by WorkerPool._next
# Seconds a closing pool waits for its stand-ins (they stop at once when cancelled).
_CLOSE_WAIT = 10.0
# Seconds worker processes wait at most for the stand-ins' first batch before starting
# (on a cold cache their start would take the CPU from the first shard's download).
_LAUNCH_DELAY = 2.0


class WorkerPool(AsyncResource):
    """Run ``job`` in ``num_workers`` workers and merge their batches in the plan's order.

    Args:
        job: the picklable job each worker opens with its worker id.
        num_workers: how many workers (>= 1).
        mode: ``"process"`` or ``"thread"``.
        prefetch: batches each worker may have waiting for the consumer (at least; small
            batches queue deeper, see :mod:`astream._dataset.depth`).
        loop_factory: makes each worker's event loop.
        schedule: the worker of each batch, in the order they are yielded
            (:func:`astream._sampling.order.round_robin` of the plan); a worker that ends
            before its share raises :class:`WorkerError`. ``None``: round-robin over
            whatever each worker produces.
        start: how processes start (:func:`astream._dataset.workers.startup.decide_start`).
        crew: where processes are kept between epochs (persistent workers); the pool
            reuses its running ones and gives back those that ended cleanly.
    """

    def __init__(
        self,
        job: WorkerJob,
        num_workers: int,
        mode: str,
        prefetch: int,
        loop_factory: Callable[[], asyncio.AbstractEventLoop],
        schedule: Sequence[int] | None = None,
        start: WorkerStart | None = None,
        crew: Crew | None = None,
    ) -> None:
        if mode not in WORKER_MODES:
            raise ConfigError(f"worker_mode={mode!r} is not one of {', '.join(WORKER_MODES)}")
        if num_workers < 1:
            raise ConfigError(f"a WorkerPool needs num_workers >= 1, got {num_workers}")
        self._job = job
        self._num_workers = num_workers
        self._mode = mode
        self._prefetch = max(1, prefetch)
        self._loop_factory = loop_factory
        self._start_how = start if start is not None else WorkerStart()
        self._crew = crew
        self._keeps = False  # the crew lent us its place: processes that end cleanly go back
        self._complete = False  # the consumer took every batch of the schedule
        self._schedule = None if schedule is None else [int(w) for w in schedule]
        if self._schedule is not None and any(not 0 <= w < num_workers for w in self._schedule):
            raise ConfigError(f"a WorkerPool schedule names a worker outside 0..{num_workers - 1}")
        self._loop: asyncio.AbstractEventLoop | None = None
        self._queues: list[asyncio.Queue[tuple[str, Any]]] = []
        # Room in each worker's queue, thread-safe: a slot is taken before a batch is handed
        # over and given back when the consumer takes it.
        self._slots: list[threading.Semaphore] = []
        self._sized: list[bool] = []  # the queue depth of worker w was fitted to its batches
        self._processes: list[ProcessWorker] = []
        self._threads: list[threading.Thread] = []
        self._thread_tasks: list[tuple[asyncio.AbstractEventLoop, asyncio.Task[None]]] = []
        self._stand_ins: StandIns | None = None
        self.launch = threading.Event()  # processes may start (set at once without stand-ins)
        self.stopping = threading.Event()
        self._started = False
        self._closed = False

    async def _aopen(self) -> None:
        if self._crew is not None and self._mode == "process":
            # In a thread: a worker still finishing its start may need this loop to hand over.
            await asyncio.to_thread(self._crew.settle)
        self._start(asyncio.get_running_loop())

    def _start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._started = True
        self._loop = loop
        # The asyncio queues are unbounded (the slots count capacity), so a put from
        # another thread can never block or race.
        self._queues = [asyncio.Queue() for _ in range(self._num_workers)]
        self._slots = [threading.Semaphore(self._prefetch) for _ in range(self._num_workers)]
        if self._mode == "thread":
            for wid in range(self._num_workers):
                thread = threading.Thread(target=self._run_thread_worker, args=(wid,),
                                          name=f"astream-worker-{wid}", daemon=True)
                thread.start()
                self._threads.append(thread)
            return
        payload = pickle.dumps(self._job)  # once, here: every worker and stand-in gets a copy
        warm: list[ProcessWorker] | None = None
        if self._crew is not None:
            self._keeps, warm = self._crew.acquire(self._num_workers)
        # Running workers take the job at once: stand-ins only while processes start.
        stand_in = bool(getattr(self._job, "stand_in", False)) and warm is None
        if warm is not None:
            self._processes = warm
        else:
            ctx = process_context(type(self._job).__module__, self._start_how)
            self._processes = [ProcessWorker(ctx, payload, wid, self._loop_factory,
                                             with_control=stand_in or self._keeps,
                                             start=self._start_how, persistent=self._keeps)
                               for wid in range(self._num_workers)]
        if stand_in:
            self._stand_ins = StandIns(self._queues, self._slots, self.launch)
            self._stand_ins.start(loop, payload, _LAUNCH_DELAY)
        else:
            self.launch.set()
        for worker in self._processes:
            worker.start_thread(self, payload if warm is not None else None)

    # -- PoolSide: called from the helper threads -------------------------------------------

    def take_slot(self, wid: int) -> bool:
        """Wait for room in worker ``wid``'s queue; False once stopping."""
        while not self.stopping.is_set():
            if self._slots[wid].acquire(timeout=0.2):
                return True
        return False

    def hand_over(self, wid: int, msg: tuple[str, Any]) -> bool:
        assert self._loop is not None
        try:
            self._loop.call_soon_threadsafe(self._queues[wid].put_nowait, msg)
        except RuntimeError:
            return False  # the consumer's loop is closed
        return True

    def decide_start(self, wid: int, msg: tuple[str, Any]) -> int | None:
        """Worker ``wid``'s first message reached us: where it starts (None: stopping)."""
        assert self._loop is not None
        if self._stand_ins is None:
            return 0  # a running worker's next epoch: nobody stood in
        decision: concurrent.futures.Future[int] = concurrent.futures.Future()
        try:
            self._loop.call_soon_threadsafe(self._stand_ins.take_over, wid, msg, decision)
        except RuntimeError:
            return None  # the consumer's loop is closed
        while not self.stopping.is_set():
            with contextlib.suppress(concurrent.futures.TimeoutError):
                return decision.result(timeout=0.2)
        return None

    def start_failed(self, wid: int, msg: tuple[str, Any]) -> None:
        self.hand_over(wid, msg)
        if self._stand_ins is not None and self._loop is not None:
            with contextlib.suppress(RuntimeError):
                self._loop.call_soon_threadsafe(self._stand_ins.cancel, wid)

    # -- thread workers ----------------------------------------------------------------------

    def _run_thread_worker(self, wid: int) -> None:
        async def emit(msg: tuple[str, Any]) -> None:
            if not await asyncio.to_thread(self.take_slot, wid) or not self.hand_over(wid, msg):
                raise asyncio.CancelledError

        loop = self._loop_factory()
        try:
            task = loop.create_task(produce(self._job, wid, emit))
            self._thread_tasks.append((loop, task))
            with contextlib.suppress(asyncio.CancelledError):
                loop.run_until_complete(task)
        finally:
            loop.close()

    # -- the consumer --------------------------------------------------------------------------

    async def batches(self) -> AsyncIterator[Any]:
        """Yield the workers' batches in the schedule's order (round-robin without one)."""
        if not self._started:
            raise WorkerError("WorkerPool.batches() called outside `async with pool`")
        self._sized = [False] * self._num_workers
        if self._schedule is None:
            live = list(range(self._num_workers))
            while live:
                still = []
                for wid in live:
                    batch = await self._next(wid)
                    if batch is not _END:
                        still.append(wid)
                        yield batch
                live = still
            self._complete = True
            return
        taken = [0] * self._num_workers
        for wid in self._schedule:
            batch = await self._next(wid)
            if batch is _END:
                share = self._schedule.count(wid)
                raise WorkerError(
                    f"loader worker {wid} ended after {taken[wid]} batches; the epoch plan gives it {share}"
                )
            taken[wid] += 1
            yield batch
        self._complete = True

    async def _next(self, wid: int) -> Any:
        """Worker ``wid``'s next batch, or ``_END`` when it has finished."""
        kind, value = await self._queues[wid].get()
        if kind == "error":
            raise WorkerError(value)
        if kind != "batch":
            return _END
        if not self._sized[wid]:
            # Small batches: let this worker's queue grow deeper (depth.py).
            self._sized[wid] = True
            extra = queue_depth(self._prefetch, value) - self._prefetch
            if extra > 0:
                self._slots[wid].release(extra)
        self._slots[wid].release()
        if self._stand_ins is not None:
            self._stand_ins.freed(wid)
        return value

    # -- closing ---------------------------------------------------------------------------------

    async def aclose(self) -> None:
        """Stop every worker and helper thread; idempotent."""
        if self._closed:
            return
        self._closed = True
        if not (self._keeps and self._complete):
            self.stopping.set()  # else after the reader threads read each worker's "end"
        if self._stand_ins is not None:
            self._stand_ins.cancel_all()
        for loop, task in self._thread_tasks:
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(task.cancel)
        if not (self._keeps and self._complete):
            for worker in self._processes:
                worker.terminate()
        # The rest runs to the end even when the caller is cancelled meanwhile (a consumer
        # that stops while the pool is already closing after its last batch): otherwise
        # the pipes and sockets would stay open. It is bounded: every join has a timeout.
        finishing = asyncio.ensure_future(self._finish_close())
        cancelled = False
        while not finishing.done():
            try:
                await asyncio.shield(finishing)
            except asyncio.CancelledError:
                cancelled = True
        finishing.result()
        if cancelled:
            raise asyncio.CancelledError

    async def _finish_close(self) -> None:
        if self._stand_ins is not None:
            await self._stand_ins.aclose(_CLOSE_WAIT)  # bounded: a close never hangs on a stand-in
        if self._crew is not None and self._keeps and self._complete and self._crew.give_back(
                self._processes, self.stopping):
            # The consumer has the whole epoch: workers still starting (the stand-ins served
            # it all) finish their start and their "end" in the background, and the next
            # epoch waits for them (Crew.acquire) instead of this one's end (with 2 workers
            # on a loaded 2-core machine ~1 s, most of an epoch of 1,000 x 100 KB).
            return
        await asyncio.to_thread(self._join_all)
        if self._crew is not None and self._keeps:
            kept = self._processes if self._complete and all(w.clean for w in self._processes) else []
            if kept and self._crew.give_back(kept):
                return
            self._crew.give_back([])
            await asyncio.to_thread(self._join_processes)
        for worker in self._processes:
            worker.close()

    def _join_all(self) -> None:
        for thread in self._threads:
            thread.join(timeout=5)
        if self._keeps and self._complete:
            # Each reader thread reads its worker's "end" after the last batch (a
            # persistent worker is reusable only then); a thread still waiting after
            # that is stuck on a worker that will not be reused.
            for worker in self._processes:
                if worker.thread is not None:
                    worker.thread.join(timeout=5)
            self.stopping.set()
            for worker in self._processes:
                if not worker.clean:
                    worker.terminate()
            if all(w.clean for w in self._processes):
                return
        self._join_processes()

    def _join_processes(self) -> None:
        for worker in self._processes:
            worker.terminate()
            worker.join()
