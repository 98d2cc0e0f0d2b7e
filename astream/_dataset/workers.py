"""Loader workers: processes (or threads) that each produce one worker's batches.

Each worker runs a picklable :class:`WorkerJob` for its worker id on an event loop of
its own and sends whole batches back; the consumer takes batch 0 of worker 0, batch 0
of worker 1, ..., then batch 1 of worker 0, skipping workers that have finished —
exactly the order a torch DataLoader gives over MosaicML Streaming.

Processes start with ``forkserver`` (``spawn`` where it is missing): never a plain
fork, because the parent may already run an event loop and threads (uvloop and
aiohttp are not fork-safe). The forkserver preloads the job's module, so a worker is a
fork of an interpreter that has imported astream already, not a fresh import each.
A worker that raises sends its traceback; one that dies (SIGKILL, segfault) is noticed
by its pipe closing. Either way the consumer gets a :class:`WorkerError`, never a hang.

Stand-ins (for jobs that set ``stand_in = True``): a process takes a while to start,
so the consumer runs each worker's job itself, on its own loop, until that worker says
it is ready; the worker is then told how many batches it already has and starts after
them (the epoch reader skips them without reading, see ``reader.batch_start``). The
batches and their order are the same; the first ones just arrive without waiting for
interpreters to start, and an epoch shorter than a worker's start-up never waits at all.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import multiprocessing as mp
import os
import pickle
import socket
import struct
import threading
import traceback
import warnings
from collections.abc import AsyncIterator, Callable, Sequence
from contextlib import AbstractAsyncContextManager
from multiprocessing.connection import Connection
from typing import Any, Protocol

from astream._dataset.depth import queue_depth
from astream._dataset.reader import StartAt

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]
from astream._dataset.transport import PipeWriter, TransportError, fd_passing_supported, recv_object
from astream.errors import ConfigError, WorkerError

__all__ = ["WorkerJob", "WorkerPool"]

WORKER_MODES = ("process", "thread")

_END = object()  # a worker's "end" message, as returned by WorkerPool._next


class WorkerJob(Protocol):
    """What a worker runs: picklable, opened once per worker in the worker itself."""

    def open(
        self, worker_id: int, start_at: StartAt | None = None
    ) -> AbstractAsyncContextManager[AsyncIterator[Any]]: ...


_START = struct.Struct("<q")


def _context(preload: str | None = None) -> mp.context.BaseContext:
    methods = mp.get_all_start_methods()
    if "forkserver" not in methods:
        return mp.get_context("spawn")
    ctx = mp.get_context("forkserver")
    if preload:
        # Takes effect when the forkserver starts (the first time any forkserver process
        # starts here); the modules already asked for, ``__main__`` by default, stay.
        from multiprocessing import forkserver

        current = list(getattr(getattr(forkserver, "_forkserver", None), "_preload_modules", None) or ["__main__"])
        if preload not in current:
            with contextlib.suppress(Exception):
                ctx.set_forkserver_preload([*current, preload])
    return ctx


async def _produce(
    job: WorkerJob, worker_id: int, emit: Callable[[tuple[str, Any]], Any],
    start: Callable[[], Any] | None = None,
) -> None:
    """Run the job and emit its batches, then "end" (or "error").

    With ``start`` (a process worker with a stand-in), the worker first asks where to
    begin: the reader calls ``start`` when its batches begin; a job whose iterator does
    not is asked after its first batch and skips the batches the stand-in delivered.
    """
    asked: list[int] = []

    async def ask() -> int:
        if not asked:
            asked.append(await start())  # type: ignore[misc]
        return asked[0]

    try:
        async with job.open(worker_id, ask if start is not None else None) as batches:
            skip = 0
            async for batch in batches:
                if start is not None and not asked:
                    skip = await ask()  # the iterator did not ask: skip by hand
                    if skip < 0:
                        break
                if skip > 0:
                    skip -= 1
                    continue
                await emit(("batch", batch))
            if start is not None and not asked:
                await ask()
    except BaseException as exc:
        await emit(("error", _describe(exc, worker_id)))
        if not isinstance(exc, Exception):
            raise
    else:
        await emit(("end", None))


def _describe(exc: BaseException, worker_id: int) -> str:
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return f"loader worker {worker_id} raised {type(exc).__name__}: {exc}\n\nworker traceback:\n{text}"


def _socket_of(conn: Connection) -> socket.socket:
    """The socket under a duplex connection (which is closed)."""
    sock = socket.socket(fileno=os.dup(conn.fileno()))
    conn.close()
    return sock


def _process_main(
    payload: bytes, worker_id: int, conn: Connection, loop_factory: Callable[[], Any],
    control: Connection | None = None, files: Connection | None = None,
) -> None:
    job: WorkerJob = pickle.loads(payload)
    loop = loop_factory()
    writer: PipeWriter | None = None
    # Large buffers go as anonymous files over this socket (see transport).
    channel = _socket_of(files) if files is not None else None

    async def emit(msg: tuple[str, Any]) -> None:
        # Written from the loop without blocking it (a full pipe suspends this task only:
        # that is the back-pressure, and the loop keeps prefetching shards meanwhile).
        nonlocal writer
        if writer is None:
            writer = await PipeWriter.open(conn, channel)
        await writer.send(msg)

    async def start() -> int:
        # Ready: the job is open (imports, node, plan done). The consumer answers with the
        # number of batches its stand-in delivered, or -1 when it delivered them all.
        assert control is not None
        await emit(("ready", None))
        answer = await loop.run_in_executor(None, control.recv_bytes)
        return int(_START.unpack(answer)[0])

    async def main() -> None:
        try:
            await _produce(job, worker_id, emit, start if control is not None else None)
        finally:
            if writer is not None:
                await writer.aclose()

    try:
        loop.run_until_complete(main())
    except (BrokenPipeError, ConnectionError, EOFError, KeyboardInterrupt):
        pass  # the consumer went away; nothing left to report to
    finally:
        loop.close()
        conn.close()
        if control is not None:
            control.close()
        if channel is not None:
            channel.close()


# Bytes a worker's pipe holds (Linux; the default is 64 KiB): room for dozens of small
# batches, so a worker runs ahead while the consumer waits for a time slice, and big
# batches cross in a few writes instead of one per 64 KiB.
_PIPE_BYTES = 1 << 20
# Seconds a closing pool waits for its stand-ins (they stop at once when cancelled).
_CLOSE_WAIT = 10.0
# Seconds worker processes wait at most for the stand-ins' first batch before starting
# (on a cold cache their start would take the CPU from the first shard's download).
_LAUNCH_DELAY = 2.0


def _widen(conn: Connection) -> None:
    set_size = getattr(fcntl, "F_SETPIPE_SZ", None) if fcntl is not None else None
    if set_size is not None:
        with contextlib.suppress(OSError, ValueError):
            fcntl.fcntl(conn.fileno(), set_size, _PIPE_BYTES)


class WorkerPool:
    """Run ``job`` in ``num_workers`` workers and merge their batches round-robin.

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
    """

    def __init__(
        self,
        job: WorkerJob,
        num_workers: int,
        mode: str,
        prefetch: int,
        loop_factory: Callable[[], asyncio.AbstractEventLoop],
        schedule: Sequence[int] | None = None,
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
        self._schedule = None if schedule is None else [int(w) for w in schedule]
        if self._schedule is not None and any(not 0 <= w < num_workers for w in self._schedule):
            raise ConfigError(f"a WorkerPool schedule names a worker outside 0..{num_workers - 1}")
        self._queues: list[asyncio.Queue[tuple[str, Any]]] = []
        self._procs: list[Any] = []
        self._conns: list[Connection] = []
        self._threads: list[threading.Thread] = []
        self._slots: list[threading.Semaphore] = []
        self._thread_tasks: list[tuple[asyncio.AbstractEventLoop, asyncio.Task[None]]] = []
        self._stand_in = mode == "process" and bool(getattr(job, "stand_in", False))
        self._controls: list[Connection] = []
        self._channels: list[socket.socket] = []  # the consumer's ends of the file sockets
        self._stand_ins: list[asyncio.Task[None]] = []
        self._produced: list[int] = []
        self._stand_in_done: list[bool] = []
        self._freed: list[asyncio.Event] = []
        self._first: list[asyncio.Event] = []  # stand-in w delivered its first batch (or stopped)
        self._launch = threading.Event()  # processes may start (set at once without stand-ins)
        self._stopping = threading.Event()
        self._sized: list[bool] = []  # the queue depth of worker w was fitted to its batches
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
            if not self._stand_in:
                self._launch.set()
            ctx = _context(type(self._job).__module__)
            payload = pickle.dumps(self._job)  # once, here: every worker and stand-in gets a copy
            if self._stand_in:
                self._produced = [0] * self._num_workers
                self._stand_in_done = [False] * self._num_workers
                self._freed = [asyncio.Event() for _ in range(self._num_workers)]
                self._first = [asyncio.Event() for _ in range(self._num_workers)]
                loop.call_later(_LAUNCH_DELAY, self._launch.set)
                self._stand_ins = [
                    loop.create_task(self._run_stand_in(wid, pickle.loads(payload)))
                    for wid in range(self._num_workers)
                ]
            for wid in range(self._num_workers):
                parent, child = ctx.Pipe(duplex=False)
                _widen(parent)
                control_in: Connection | None = None
                if self._stand_in:
                    control_in, control_out = ctx.Pipe(duplex=False)
                    self._controls.append(control_out)
                files_in: Connection | None = None
                channel: socket.socket | None = None
                if fd_passing_supported():
                    files_out, files_in = ctx.Pipe(duplex=True)  # a Unix socket pair
                    channel = _socket_of(files_out)
                    self._channels.append(channel)
                proc = ctx.Process(  # type: ignore[attr-defined]
                    target=_process_main,
                    args=(payload, wid, child, self._loop_factory, control_in, files_in),
                    name=f"astream-worker-{wid}",
                    daemon=True,
                )
                self._procs.append(proc)
                self._conns.append(parent)
                # The helper thread starts the process: the first start also starts the
                # forkserver, which takes as long as an interpreter's start and imports,
                # and the loop must not wait for that (stand-ins work meanwhile).
                reader = threading.Thread(
                    target=self._start_and_read,
                    args=(wid, parent, channel, proc, loop, (child, control_in, files_in)),
                    name=f"astream-reader-{wid}", daemon=True,
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

    def _recv(
        self, wid: int, conn: Connection, channel: socket.socket | None, proc: Any,
    ) -> tuple[str, Any] | None:
        try:
            msg: tuple[str, Any] = recv_object(conn, channel)
        except TransportError as exc:
            if self._stopping.is_set():
                return None
            msg = ("error", f"loader worker {wid} (pid {proc.pid}): a batch could not be received: {exc}")
        except (EOFError, OSError):
            if self._stopping.is_set():
                return None
            proc.join(timeout=5)
            msg = (
                "error",
                f"loader worker {wid} (pid {proc.pid}) died without a word "
                f"(exit code {proc.exitcode}); it was killed or crashed in native code",
            )
        return msg

    def _start_and_read(
        self, wid: int, conn: Connection, channel: socket.socket | None, proc: Any,
        loop: asyncio.AbstractEventLoop, child_ends: tuple[Connection, Connection | None, Connection | None],
    ) -> None:
        # With stand-ins, the interpreters start once the first batch is on its way (or after
        # _LAUNCH_DELAY): before, they would only take the CPU from it.
        while not self._launch.wait(0.2):
            if self._stopping.is_set():
                break
        if self._stopping.is_set():
            for end in child_ends:
                if end is not None:
                    end.close()
            return
        try:
            proc.start()
        except BaseException as exc:
            self._hand_over(wid, ("error", f"loader worker {wid} could not start: {exc!r}"), loop)
            if self._stand_in:
                with contextlib.suppress(RuntimeError):
                    loop.call_soon_threadsafe(self._cancel_stand_in, wid)
            return
        finally:
            for end in child_ends:
                if end is not None:
                    end.close()  # so that the worker's death closes the pipe for us
        if self._stopping.is_set():  # closed while it started: aclose may have missed it
            proc.terminate()
            return
        self._read_pipe(wid, conn, channel, proc, loop)

    def _cancel_stand_in(self, wid: int) -> None:
        if not self._stand_in_done[wid]:
            self._stand_ins[wid].cancel()

    def _read_pipe(
        self, wid: int, conn: Connection, channel: socket.socket | None, proc: Any,
        loop: asyncio.AbstractEventLoop,
    ) -> None:
        if self._stand_in:
            msg = self._recv(wid, conn, channel, proc)
            if msg is None:
                return
            decision: concurrent.futures.Future[int] = concurrent.futures.Future()
            try:
                loop.call_soon_threadsafe(self._take_over, wid, msg, decision)
            except RuntimeError:
                return  # the consumer's loop is closed
            while not self._stopping.is_set():
                try:
                    if decision.result(timeout=0.2) < 0:
                        return  # the stand-in did it all (or failed): nothing more to read
                    break
                except concurrent.futures.TimeoutError:
                    continue
            else:
                return
        while self._take_slot(wid):
            msg = self._recv(wid, conn, channel, proc)
            if msg is None or not self._hand_over(wid, msg, loop) or msg[0] != "batch":
                return

    # -- stand-ins (on the consumer's loop) ------------------------------------------------

    async def _run_stand_in(self, wid: int, job: WorkerJob) -> None:
        """Produce worker ``wid``'s batches here until its process takes over."""
        queue = self._queues[wid]
        try:
            if wid:  # one at a time to the first batch: worker 0's comes first
                await self._first[wid - 1].wait()
            async with job.open(wid) as batches:
                async for batch in batches:
                    while not self._slots[wid].acquire(blocking=False):
                        self._freed[wid].clear()
                        await self._freed[wid].wait()
                    self._produced[wid] += 1
                    queue.put_nowait(("batch", batch))
                    if not self._first[wid].is_set():
                        self._first[wid].set()
                        if wid == 0:
                            self._launch.set()
                    # Let the consumer (on this loop) take it now: with a warm cache the
                    # reader never waits, and the stand-in would fill its whole queue before
                    # the first batch left (warm first batch ~23 ms -> ~12 ms).
                    await asyncio.sleep(0)
        except asyncio.CancelledError:
            self._first[wid].set()
            self._launch.set()
            raise
        except Exception as exc:
            self._first[wid].set()
            self._launch.set()
            self._stand_in_done[wid] = True
            queue.put_nowait(("error", _describe(exc, wid)))
        else:
            self._first[wid].set()
            self._launch.set()
            self._stand_in_done[wid] = True
            queue.put_nowait(("end", None))

    def _take_over(self, wid: int, msg: tuple[str, Any], decision: concurrent.futures.Future[int]) -> None:
        """Worker ``wid`` sent its first message: stop the stand-in, say where to start."""
        task = self._stand_ins[wid]
        done = self._stand_in_done[wid]
        if not done:
            task.cancel()
        if msg[0] != "ready":  # it failed (or died) before it was ready: that is its answer
            decision.set_result(-1)
            if not done:
                self._slots[wid].acquire(blocking=False)
                self._queues[wid].put_nowait(msg)
            return
        start = -1 if done else self._produced[wid]
        with contextlib.suppress(OSError):
            self._controls[wid].send_bytes(_START.pack(start))
        decision.set_result(start)

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
        if self._freed:
            self._freed[wid].set()
        return value

    async def aclose(self) -> None:
        """Stop every worker and helper thread; idempotent."""
        if self._closed:
            return
        self._closed = True
        self._stopping.set()
        for task in self._stand_ins:
            task.cancel()
        for loop, task in self._thread_tasks:
            with contextlib.suppress(RuntimeError):
                loop.call_soon_threadsafe(task.cancel)
        for proc in self._procs:
            if proc.is_alive():
                proc.terminate()  # its end of the pipe closes, which wakes our reader thread
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
        if self._stand_ins:
            # Bounded, like the joins below: a close never hangs on a stand-in.
            _, stuck = await asyncio.wait(self._stand_ins, timeout=_CLOSE_WAIT)
            if stuck:
                warnings.warn(f"{len(stuck)} loader stand-in(s) did not stop within {_CLOSE_WAIT}s of close",
                              RuntimeWarning, stacklevel=2)
        await asyncio.to_thread(self._join_all)
        for conn in [*self._conns, *self._controls]:
            conn.close()  # only now: closing under a reading thread is not safe
        for channel in self._channels:
            channel.close()

    def _join_all(self) -> None:
        for thread in self._threads:
            thread.join(timeout=5)
        for proc in self._procs:
            if proc._popen is None:  # never started
                continue
            if proc.is_alive():
                proc.terminate()
            proc.join(timeout=5)
            if proc.is_alive():
                proc.kill()
                proc.join(timeout=5)
