"""Picklable jobs for the worker-pool tests (importable by spawned workers)."""

from __future__ import annotations

import asyncio
import os
import signal
from collections.abc import AsyncIterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from typing import Any

import numpy as np


@dataclass
class RangeJob:
    """Worker w yields batches [w*100 + i] for i < counts[w], as arrays."""

    counts: tuple[int, ...]
    fail_worker: int | None = None
    fail_after: int = 0
    die_worker: int | None = None
    refused_worker: int | None = None  # its batch ``fail_after`` holds an object the consumer cannot unpickle

    @asynccontextmanager
    async def open(self, worker_id: int, start_at: Any = None) -> AsyncIterator[AsyncIterator[dict[str, np.ndarray]]]:
        async def gen() -> AsyncIterator[dict[str, np.ndarray]]:
            for i in range(self.counts[worker_id]):
                if worker_id == self.fail_worker and i == self.fail_after:
                    raise ValueError(f"bad shard in worker {worker_id}")
                if worker_id == self.die_worker and i == self.fail_after:
                    os.kill(os.getpid(), signal.SIGKILL)
                await asyncio.sleep(0)
                batch: dict[str, Any] = {"x": np.full((4, 8), worker_id * 100 + i, dtype=np.int32),
                                         "pid": np.array([os.getpid()])}
                if worker_id == self.refused_worker and i == self.fail_after:
                    batch["odd"] = Refused()
                yield batch

        yield gen()


def _refuse() -> None:
    raise ValueError("this object cannot be rebuilt here")


class Refused:
    """An object that pickles, but whose unpickling raises (in the consumer)."""

    def __reduce__(self) -> tuple[Any, tuple[()]]:
        return _refuse, ()


def tag_pid(batch: dict[str, Any]) -> dict[str, Any]:
    """A batch_transform that says which process made the batch."""
    batch["pid"] = np.full(len(batch["id"]), os.getpid())
    return batch


def busy_tag_pid(batch: dict[str, Any]) -> dict[str, Any]:
    """:func:`tag_pid` after ~3 ms of CPU: a batch costlier to make than to carry across."""
    import time

    end = time.thread_time() + 0.003
    while time.thread_time() < end:
        pass
    return tag_pid(batch)
