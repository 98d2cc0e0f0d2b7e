"""Worker processes: starting them, and carrying their messages to the consumer.

Processes start with ``forkserver`` (``spawn`` where it is missing): never a plain
fork, because the parent may already run an event loop and threads (uvloop and
aiohttp are not fork-safe). The forkserver preloads the job's module, so a worker is a
fork of an interpreter that has imported astream already, not a fresh import each
(:mod:`astream._dataset.workers.startup` decides what it preloads, and starts it early).

Each worker has a pipe for its messages (large buffers go in shared-memory slots, or as
anonymous files over a Unix socket beside it, see :mod:`astream._dataset.transport.pipe`) and, with stand-ins, a
control pipe for the hand-off (:mod:`astream._dataset.workers.handoff`). A helper thread per
worker starts the process and reads its pipe; what it reads goes to the pool through
the narrow :class:`PoolSide` interface. A worker that dies (SIGKILL, segfault) is
noticed by its pipe closing and reported as an error message, never a hang.
"""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import pickle
import socket
import threading
import time
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any, Protocol

from astream._dataset.observe.timings import STAGES
from astream._dataset.transport.pipe import (
    PipeReader,
    PipeWriter,
    TransportError,
    fd_passing_supported,
    recv_rest,
)
from astream._dataset.transport.slabs import SlabViews
from astream._dataset.workers.handoff import send_start, worker_start_at
from astream._dataset.workers.job import WorkerJob, produce
from astream._dataset.workers.startup import WorkerStart, hidden_main

try:
    import fcntl
except ImportError:  # pragma: no cover - Windows
    fcntl = None  # type: ignore[assignment]

__all__ = ["PoolSide", "ProcessWorker"]

# Bytes a worker's pipe holds (Linux; the default is 64 KiB): room for dozens of small
# batches, so a worker runs ahead while the consumer waits for a time slice, and big
# batches cross in a few writes instead of one per 64 KiB.
_PIPE_BYTES = 1 << 20


def _socket_of(conn: Connection) -> socket.socket:
    """The socket under a duplex connection (which is closed)."""
    sock = socket.socket(fileno=os.dup(conn.fileno()))
    conn.close()
    return sock


def _widen(conn: Connection) -> None:
    set_size = getattr(fcntl, "F_SETPIPE_SZ", None) if fcntl is not None else None
    if set_size is not None:
        with contextlib.suppress(OSError, ValueError):
            fcntl.fcntl(conn.fileno(), set_size, _PIPE_BYTES)


def _process_main(
    payload: bytes, worker_id: int, conn: Connection, loop_factory: Callable[[], Any],
    control: Connection | None = None, files: Connection | None = None, persistent: bool = False,
) -> None:
    loop = loop_factory()
    writer: PipeWriter | None = None
    channel = _socket_of(files) if files is not None else None

    async def emit(msg: tuple[str, Any]) -> None:
        # Written from the loop without blocking it (a full pipe suspends this task only:
        # that is the back-pressure, and the loop keeps prefetching shards meanwhile).
        nonlocal writer
        if writer is None:
            writer = await PipeWriter.open(conn, channel)
        if msg[0] == "end":
            msg = ("end", STAGES.take())  # this process's stage times reach the consumer's
        await writer.send(msg)

    async def main() -> None:
        job_bytes = payload
        try:
            while job_bytes:
                job: WorkerJob = pickle.loads(job_bytes)
                start_at = worker_start_at(emit, control, loop) if control is not None else None
                await produce(job, worker_id, emit, start_at)
                del job  # its dataset (shard maps, node client) was closed by the job
                if not persistent or control is None:
                    break
                # A persistent worker waits for its next epoch's job (b"": exit): the
                # process, its loop and its pipes are made once for all epochs.
                job_bytes = await loop.run_in_executor(None, control.recv_bytes)
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


class PoolSide(Protocol):
    """What a worker's reader thread needs of the pool (all callable from that thread)."""

    stopping: threading.Event
    launch: threading.Event

    def take_slot(self, wid: int) -> bool: ...

    def hand_over(self, wid: int, msg: tuple[str, Any]) -> bool: ...

    def decide_start(self, wid: int, msg: tuple[str, Any]) -> int | None: ...

    def start_failed(self, wid: int, msg: tuple[str, Any]) -> None: ...


class ProcessWorker:
    """One worker process, its pipes, and the helper thread that starts and reads it."""

    def __init__(
        self, ctx: mp.context.BaseContext, payload: bytes, wid: int, loop_factory: Callable[[], Any],
        with_control: bool, start: WorkerStart, persistent: bool = False,
    ) -> None:
        self.wid = wid
        self._start = start
        # The last epoch ended at a message boundary (its "end" read): the process may
        # take another epoch's job. Written by the reader thread, read after its join.
        self.clean = False
        self._next_payload: bytes | None = None
        self.conn, child = ctx.Pipe(duplex=False)
        _widen(self.conn)
        # Read by the reader threads only (one at a time, epoch after epoch: what one
        # buffered, the next goes on from), in large chunks where there is os.readv.
        self.pipe: PipeReader | Connection = PipeReader(self.conn) if hasattr(os, "readv") else self.conn
        self.control: Connection | None = None
        control_in: Connection | None = None
        if with_control:
            control_in, self.control = ctx.Pipe(duplex=False)
        self.channel: socket.socket | None = None
        files_in: Connection | None = None
        if fd_passing_supported():
            files_out, files_in = ctx.Pipe(duplex=True)  # a Unix socket pair
            self.channel = _socket_of(files_out)
        # The worker's shared-memory slots as mapped here (the process's whole life long).
        self.slabs = SlabViews(self.channel) if self.channel is not None else None
        self.proc = ctx.Process(  # type: ignore[attr-defined]
            target=_process_main, args=(payload, wid, child, loop_factory, control_in, files_in, persistent),
            name=f"astream-worker-{wid}", daemon=True,
        )
        self._child_ends = (child, control_in, files_in)
        self.thread: threading.Thread | None = None

    @property
    def started(self) -> bool:
        return self.proc._popen is not None

    def start_thread(self, pool: PoolSide, payload: bytes | None = None) -> None:
        """Start the process (or, with ``payload``, give the running one its next job) and read it."""
        # The helper thread starts the process: the first start also starts the forkserver,
        # which takes as long as an interpreter's start and imports, and the consumer's
        # loop must not wait for that (stand-ins work meanwhile).
        self.clean = False
        self._next_payload = payload
        self.thread = threading.Thread(target=self._start_and_read, args=(pool,),
                                       name=f"astream-reader-{self.wid}", daemon=True)
        self.thread.start()

    def _close_child_ends(self) -> None:
        for end in self._child_ends:
            if end is not None:
                end.close()  # so that the worker's death closes the pipe for us

    def _start_and_read(self, pool: PoolSide) -> None:
        if self._next_payload is not None:  # a persistent worker, already running
            assert self.control is not None
            with contextlib.suppress(OSError):  # it died: its pipe's end is read as an error below
                self.control.send_bytes(self._next_payload)
            self._read(pool)
            return
        while not pool.launch.wait(0.2):
            if pool.stopping.is_set():
                break
        if pool.stopping.is_set():
            self._close_child_ends()
            return
        try:
            with hidden_main(self._start):
                self.proc.start()
        except BaseException as exc:
            pool.start_failed(self.wid, ("error", f"loader worker {self.wid} could not start: {exc!r}"))
            return
        finally:
            self._close_child_ends()
        if pool.stopping.is_set():  # closed while it started: the close may have missed it
            self.proc.terminate()
            return
        self._read(pool)

    def _read(self, pool: PoolSide) -> None:
        if self.control is not None:
            msg = self._recv(pool)
            if msg is None:
                return
            start = pool.decide_start(self.wid, msg)
            if start is None:
                return  # stopping
            if msg[0] == "ready":
                try:
                    send_start(self.control, start)
                except OSError:
                    return
            if start < 0:
                # The stand-in did it all (or the worker failed before it was ready): the
                # worker's last word ("end") closes the epoch; nothing to hand over.
                if msg[0] == "ready":
                    last = self._recv(pool)
                    self.clean = last is not None and last[0] == "end"
                return
        while pool.take_slot(self.wid):
            msg = self._recv(pool)
            if msg is None or not pool.hand_over(self.wid, msg) or msg[0] != "batch":
                self.clean = msg is not None and msg[0] == "end"
                return

    def _recv(self, pool: PoolSide) -> tuple[str, Any] | None:
        wid, proc = self.wid, self.proc
        try:
            # No poll() first to time only the transport: it cost ~9 us a message (a
            # selector made per call), a fifth of a small batch's way to the consumer.
            head = self.pipe.recv_bytes()
            began = time.perf_counter()  # the batch is on its way: from here it is transport
            msg: tuple[str, Any] = recv_rest(self.pipe, head, self.channel, self.slabs)
            if msg[0] == "batch":
                STAGES.add("transport", time.perf_counter() - began)
            elif msg[0] == "end" and isinstance(msg[1], dict):
                STAGES.merge(msg[1])  # the worker's stage times, into this process's
        except TransportError as exc:
            if pool.stopping.is_set():
                return None
            msg = ("error", f"loader worker {wid} (pid {proc.pid}): a batch could not be received: {exc}")
        except (EOFError, OSError):
            if pool.stopping.is_set():
                return None
            proc.join(timeout=5)
            msg = (
                "error",
                f"loader worker {wid} (pid {proc.pid}) died without a word "
                f"(exit code {proc.exitcode}); it was killed or crashed in native code",
            )
        except Exception as exc:
            # Anything else that stops a message from being rebuilt here (an object of the
            # batch whose unpickling raises, a message this side cannot parse): this thread
            # would end with it and the consumer wait for the worker's next batch forever.
            if pool.stopping.is_set():
                return None
            msg = ("error", f"loader worker {wid} (pid {proc.pid}): a batch could not be received: {exc!r}")
        return msg

    def terminate(self) -> None:
        if self.proc.is_alive():
            self.proc.terminate()  # its end of the pipe closes, which wakes the reader thread

    def join(self) -> None:
        """Join the reader thread and the process (bounded: every join has a timeout)."""
        if self.thread is not None:
            self.thread.join(timeout=5)
        proc = self.proc
        if proc._popen is None:  # never started
            return
        if proc.is_alive():
            proc.terminate()
        proc.join(timeout=5)
        if proc.is_alive():
            proc.kill()
            proc.join(timeout=5)

    def close(self) -> None:
        """Close the consumer's ends (only after :meth:`join`: closing under a reading thread is not safe)."""
        self.conn.close()
        if self.control is not None:
            self.control.close()
        if self.slabs is not None:
            self.slabs.close()  # no more releases: the channel closes next (batches held stay valid)
        if self.channel is not None:
            self.channel.close()
