"""What a loader worker runs, and how its batches leave it.

A :class:`WorkerJob` is picklable and opened once per worker, in the worker itself (a
process, a thread, or a stand-in on the consumer's loop). :func:`produce` runs it and
emits one message per batch, then ``("end", None)`` or ``("error", text)``; the
messages are the same whatever carries them (a pipe, a queue).
"""

from __future__ import annotations

import traceback
from collections.abc import AsyncIterator, Awaitable, Callable
from contextlib import AbstractAsyncContextManager
from typing import Any, Protocol

from astream._dataset.read.reader import StartAt

__all__ = ["Emit", "WorkerJob", "describe", "produce"]

Emit = Callable[[tuple[str, Any]], Awaitable[Any]]


class WorkerJob(Protocol):
    """What a worker runs: picklable, opened once per worker in the worker itself.

    ``start_at``, when given, is asked once before the first batch how many batches to
    skip (``-1``: all); see :mod:`astream._dataset.workers.handoff`.
    """

    def open(
        self, worker_id: int, start_at: StartAt | None = None
    ) -> AbstractAsyncContextManager[AsyncIterator[Any]]: ...


async def produce(job: WorkerJob, worker_id: int, emit: Emit, start_at: StartAt | None = None) -> None:
    """Run the job and emit its batches, then "end" (or "error").

    A job that does not ask ``start_at`` itself is asked after its first batch and the
    batches to skip are dropped here, so every job honours the hand-off.
    """
    asked: list[int] = []

    async def ask() -> int:
        if not asked:
            assert start_at is not None
            asked.append(await start_at())
        return asked[0]

    try:
        async with job.open(worker_id, ask if start_at is not None else None) as batches:
            skip = 0
            async for batch in batches:
                if start_at is not None and not asked:
                    skip = await ask()  # the iterator did not ask: skip by hand
                    if skip < 0:
                        break
                if skip > 0:
                    skip -= 1
                    continue
                await emit(("batch", batch))
            if start_at is not None and not asked:
                await ask()
    except BaseException as exc:
        await emit(("error", describe(exc, worker_id)))
        if not isinstance(exc, Exception):
            raise
    else:
        await emit(("end", None))


def describe(exc: BaseException, worker_id: int) -> str:
    """A worker's error as the consumer shows it: the message and the worker's traceback."""
    text = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    return f"loader worker {worker_id} raised {type(exc).__name__}: {exc}\n\nworker traceback:\n{text}"
