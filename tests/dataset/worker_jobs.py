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

    @asynccontextmanager
    async def open(self, worker_id: int, start_at: Any = None) -> AsyncIterator[AsyncIterator[dict[str, np.ndarray]]]:
        async def gen() -> AsyncIterator[dict[str, np.ndarray]]:
            for i in range(self.counts[worker_id]):
                if worker_id == self.fail_worker and i == self.fail_after:
                    raise ValueError(f"bad shard in worker {worker_id}")
                if worker_id == self.die_worker and i == self.fail_after:
                    os.kill(os.getpid(), signal.SIGKILL)
                await asyncio.sleep(0)
                yield {"x": np.full((4, 8), worker_id * 100 + i, dtype=np.int32), "pid": np.array([os.getpid()])}

        yield gen()


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
