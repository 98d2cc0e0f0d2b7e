"""Stand-ins: the consumer reads a worker's first batches while its process starts.

A worker process takes a while to start (an interpreter, imports, the node, the plan),
so the consumer runs each worker's job itself, on its own loop, until that worker says
it is ready. The protocol, both sides of it:

1. the worker opens its job and, before reading its first batch, sends ``("ready",
   None)`` and waits (:func:`worker_start_at`, handed to the job as ``start_at``);
2. the consumer stops that worker's stand-in and answers on the worker's control pipe
   with the number of batches the stand-in delivered, or ``-1`` when it delivered them
   all (:meth:`StandIns.take_over` decides, the worker's reader thread sends it with
   :func:`send_start`; without stand-ins, a persistent worker's next epoch, it is 0);
3. the worker skips that many batches without reading them and goes on from there.

The batches and their order are the same as without stand-ins; the first ones just
arrive without waiting for interpreters to start, and an epoch shorter than a worker's
start-up never waits at all.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import pickle
import struct
import threading
import warnings
from collections.abc import Sequence
from multiprocessing.connection import Connection
from typing import Any

from astream._dataset.read.reader import StartAt
from astream._dataset.workers.job import Emit, WorkerJob, describe

__all__ = ["StandIns", "send_start", "worker_start_at"]

_START = struct.Struct("<q")


def worker_start_at(emit: Emit, control: Connection, loop: asyncio.AbstractEventLoop) -> StartAt:
    """The worker's side: say it is ready, then wait for the consumer's start point."""

    async def start_at() -> int:
        await emit(("ready", None))
        answer = await loop.run_in_executor(None, control.recv_bytes)
        return int(_START.unpack(answer)[0])

    return start_at


def send_start(control: Connection, start: int) -> None:
    """The consumer's answer to a worker's "ready": where it starts (sent by its reader thread)."""
    control.send_bytes(_START.pack(start))


class StandIns:
    """The consumer's side: one stand-in task per worker, until its process takes over.

    Args:
        queues: the pool's queue of each worker (the stand-in puts its batches there).
        slots: the pool's count of room in each queue (taken before a put).
        launch: set once worker processes may start (the first batch is on its way, or
            ``delay`` passed): before, their start would only take the CPU from it.
    """

    def __init__(
        self, queues: Sequence[asyncio.Queue[tuple[str, Any]]], slots: Sequence[threading.Semaphore],
        launch: threading.Event,
    ) -> None:
        n = len(queues)
        self._queues = queues
        self._slots = slots
        self._launch = launch
        self._tasks: list[asyncio.Task[None]] = []
        self._produced = [0] * n
        self._done = [False] * n
        self._freed = [asyncio.Event() for _ in range(n)]
        self._first = [asyncio.Event() for _ in range(n)]  # stand-in w delivered its first batch (or stopped)

    def start(self, loop: asyncio.AbstractEventLoop, payload: bytes, delay: float) -> None:
        """Start every worker's stand-in on ``loop``, each with its own copy of the job."""
        loop.call_later(delay, self._launch.set)
        self._tasks = [loop.create_task(self._run(wid, pickle.loads(payload))) for wid in range(len(self._queues))]

    async def _run(self, wid: int, job: WorkerJob) -> None:
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
            self._stopped(wid)
            raise
        except Exception as exc:
            self._stopped(wid, ("error", describe(exc, wid)))
        else:
            self._stopped(wid, ("end", None))

    def _stopped(self, wid: int, last: tuple[str, Any] | None = None) -> None:
        self._first[wid].set()
        self._launch.set()
        if last is not None:
            self._done[wid] = True
            self._queues[wid].put_nowait(last)

    def freed(self, wid: int) -> None:
        """The consumer took one of worker ``wid``'s batches."""
        self._freed[wid].set()

    def take_over(self, wid: int, msg: tuple[str, Any], decision: concurrent.futures.Future[int]) -> None:
        """Worker ``wid`` sent its first message: stop the stand-in, say where to start.

        ``decision`` gets the start point (``-1``: the worker has nothing left to send).
        Runs on the consumer's loop.
        """
        done = self._done[wid]
        if not done:
            self._tasks[wid].cancel()
        if msg[0] != "ready":  # it failed (or died) before it was ready: that is its answer
            decision.set_result(-1)
            if not done:
                self._slots[wid].acquire(blocking=False)
                self._queues[wid].put_nowait(msg)
            return
        decision.set_result(-1 if done else self._produced[wid])  # the reader thread sends it

    def cancel(self, wid: int) -> None:
        """Stop worker ``wid``'s stand-in (its process could not start)."""
        if not self._done[wid]:
            self._tasks[wid].cancel()

    def cancel_all(self) -> None:
        for task in self._tasks:
            task.cancel()

    async def aclose(self, timeout: float) -> None:
        """Cancel every stand-in and wait for them, at most ``timeout`` seconds."""
        self.cancel_all()
        if not self._tasks:
            return
        _, stuck = await asyncio.wait(self._tasks, timeout=timeout)
        if stuck:
            warnings.warn(f"{len(stuck)} loader stand-in(s) did not stop within {timeout}s of close",
                          RuntimeWarning, stacklevel=2)
