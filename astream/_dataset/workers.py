"""Loader workers: processes (or threads) that each produce one worker's batches.

Each worker runs a picklable :class:`WorkerJob` for its worker id on an event loop of
its own and sends whole batches back; the consumer takes batch 0 of worker 0, batch 0
of worker 1, ..., then batch 1 of worker 0, skipping workers that have finished —
exactly the order a torch DataLoader gives over MosaicML Streaming.

Processes start with ``forkserver`` (``spawn`` where it is missing): never a plain
fork, because the parent may already run an event loop and threads (uvloop and
aiohttp are not fork-safe). A worker that raises sends its traceback; one that dies
(SIGKILL, segfault) is noticed by its pipe closing. Either way the consumer gets a
:class:`WorkerError`, never a hang.
"""

from __future__ import annotations

import asyncio
import contextlib
import multiprocessing as mp
import threading
import traceback
from collections.abc import AsyncIterator, Callable
from contextlib import AbstractAsyncContextManager
from multiprocessing.connection import Connection
from typing import Any, Protocol

from astream._dataset.transport import recv_object, send_object
from astream.errors import ConfigError, WorkerError

__all__ = ["WorkerJob", "WorkerPool"]

WORKER_MODES = ("process", "thread")


class WorkerJob(Protocol):
    """What a worker runs: picklable, opened once per worker in the worker itself."""

    def open(self, worker_id: int) -> AbstractAsyncContextManager[AsyncIterator[Any]]: ...


def _context() -> mp.context.BaseContext:
    methods = mp.get_all_start_methods()
    return mp.get_context("forkserver" if "forkserver" in methods else "spawn")


async def _produce(job: WorkerJob, worker_id: int, emit: Callable[[tuple[str, Any]], Any]) -> None:
    try:
        async with job.open(worker_id) as batches:
            async for batch in batches:
                await emit(("batch", batch))
    except BaseException as exc:
        await emit(("error", _describe(exc, worker_id)))
        if not isinstance(exc, Exception):
            raise
    else:
        await emit(("end", None))


def _describe(exc: BaseException, worker_id: int) -> str:
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return f"loader worker {worker_id} raised {type(exc).__name__}: {exc}\n\nworker traceback:\n{text}"


def _process_main(job: WorkerJob, worker_id: int, conn: Connection, loop_factory: Callable[[], Any]) -> None:
    loop = loop_factory()

    async def emit(msg: tuple[str, Any]) -> None:
        # A full pipe blocks the sending thread: that is the back-pressure we want, but
        # not on the loop, which keeps prefetching shards meanwhile.
        await loop.run_in_executor(None, send_object, conn, msg)

    try:
        loop.run_until_complete(_produce(job, worker_id, emit))
    except (BrokenPipeError, KeyboardInterrupt):
        pass  # the consumer went away; nothing left to report to
    finally:
        loop.close()
        conn.close()


class WorkerPool:
    """Run ``job`` in ``num_workers`` workers and merge their batches round-robin.

    Args:
        job: the picklable job each worker opens with its worker id.
        num_workers: how many workers (>= 1).
        mode: ``"process"`` or ``"thread"``.
        prefetch: batches each worker may have waiting for the consumer.
        loop_factory: makes each worker's event loop.
    """

    def __init__(
        self,
        job: WorkerJob,
        num_workers: int,
        mode: str,
        prefetch: int,
        loop_factory: Callable[[], asyncio.AbstractEventLoop],
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
        self._queues: list[asyncio.Queue[tuple[str, Any]]] = []
        self._procs: list[Any] = []
        self._conns: list[Connection] = []
        self._threads: list[threading.Thread] = []
        self._slots: list[threading.Semaphore] = []
        self._thread_tasks: list[tuple[asyncio.AbstractEventLoop, asyncio.Task[None]]] = []
        self._stopping = threading.Event()
        self._started = False
        self._closed = False

    async def __aenter__(self) -> WorkerPool:
        self._start(asyncio.get_running_loop())
        return self

    async def __aexit__(self, *exc: object) -> None:
        await self.aclose()

    def _start(self, loop: asyncio.AbstractEventLoop) -> None:
        self._started = True
        # Capacity is counted by thread-safe semaphores (a slot is taken before a batch is
        # handed over and given back when the consumer takes it), so the asyncio queues
        # themselves are unbounded and a put from another thread can never block or race.
        self._queues = [asyncio.Queue() for _ in range(self._num_workers)]
        self._slots = [threading.Semaphore(self._prefetch) for _ in range(self._num_workers)]
        if self._mode == "process":
            ctx = _context()
            for wid in range(self._num_workers):
                parent, child = ctx.Pipe(duplex=False)
                proc = ctx.Process(  # type: ignore[attr-defined]
                    target=_process_main,
                    args=(self._job, wid, child, self._loop_factory),
                    name=f"astream-worker-{wid}",
                    daemon=True,
                )
                proc.start()
                child.close()  # so that the worker's death closes the pipe for us
                self._procs.append(proc)
                self._conns.append(parent)
                reader = threading.Thread(
                    target=self._read_pipe, args=(wid, parent, proc, loop), name=f"astream-reader-{wid}", daemon=True
                )
                reader.start()
                self._threads.append(reader)
        else:
            for wid in range(self._num_workers):
                thread = threading.Thread(
                    target=self._run_thread_worker, args=(wid, loop), name=f"astream-worker-{wid}", daemon=True
                )
                thread.start()
                self._threads.append(thread)

    def _take_slot(self, wid: int) -> bool:
        """Wait for room in worker ``wid``'s queue (from a helper thread); False once stopping."""
        while not self._stopping.is_set():
            if self._slots[wid].acquire(timeout=0.2):
                return True
        return False

    def _hand_over(self, wid: int, msg: tuple[str, Any], loop: asyncio.AbstractEventLoop) -> bool:
        try:
            loop.call_soon_threadsafe(self._queues[wid].put_nowait, msg)
        except RuntimeError:
            return False  # the consumer's loop is closed
        return True

    def _read_pipe(self, wid: int, conn: Connection, proc: Any, loop: asyncio.AbstractEventLoop) -> None:
        while self._take_slot(wid):
            try:
                msg = recv_object(conn)
            except (EOFError, OSError):
                if self._stopping.is_set():
                    return
                proc.join(timeout=5)
                msg = (
                    "error",
                    f"loader worker {wid} (pid {proc.pid}) died without a word "
                    f"(exit code {proc.exitcode}); it was killed or crashed in native code",
                )
            if not self._hand_over(wid, msg, loop) or msg[0] != "batch":
                return

    def _run_thread_worker(self, wid: int, consumer_loop: asyncio.AbstractEventLoop) -> None:
        async def emit(msg: tuple[str, Any]) -> None:
            if not await asyncio.to_thread(self._take_slot, wid) or not self._hand_over(wid, msg, consumer_loop):
                raise asyncio.CancelledError

        loop = self._loop_factory()
        try:
            task = loop.create_task(_produce(self._job, wid, emit))
            self._thread_tasks.append((loop, task))
            with contextlib.suppress(asyncio.CancelledError):
                loop.run_until_complete(task)
        finally:
            loop.close()

    async def batches(self) -> AsyncIterator[Any]:
        """Yield batches round-robin over the workers until all have finished."""
        if not self._started:
            raise WorkerError("WorkerPool.batches() called outside `async with pool`")
        live = list(range(self._num_workers))
        while live:
            still = []
            for wid in live:
                kind, value = await self._queues[wid].get()
                if kind == "batch":
                    self._slots[wid].release()
                    still.append(wid)
                    yield value
                elif kind == "error":
                    raise WorkerError(value)
            live = still

    async def aclose(self) -> None:
        """Stop every worker and helper thread; idempotent."""
        if self._closed:
            return
        self._closed = True
        self._stopping.set()
        for loop, task in self._thread_tasks:
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(task.cancel)
        for proc in self._procs:
            if proc.is_alive():
                proc.terminate()  # its end of the pipe closes, which wakes our reader thread
        await asyncio.to_thread(self._join_all)
        for conn in self._conns:
            conn.close()  # only now: closing under a reading thread is not safe

    def _join_all(self) -> None:
        for proc in self._procs:
            proc.join(timeout=5)
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=5)
        for thread in self._threads:
            thread.join(timeout=5)
