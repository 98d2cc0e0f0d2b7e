"""How many batches to queue ahead: at least what the user asked, more for small batches.

Every batch crosses threads (and, with worker processes, a pipe) on its way to the
training loop; each crossing wakes a thread. With a queue only two batches deep, a
producer and its consumer take turns for every small batch, and the wake-ups cost more
than reading ~32 KB batches does (Loader(2) over 1 KB samples measured ~1.5-2x faster
with 32-deep queues). So a queue holds at least ``prefetch_batches`` batches, and more
while they stay under :data:`QUEUE_BYTES`: small batches get deep queues, large ones
keep the depth asked for, and the memory held ahead stays bounded either way.
"""

from __future__ import annotations

import contextlib
import sys
from typing import Any

import numpy as np

__all__ = ["MAX_DEPTH", "QUEUE_BYTES", "batch_nbytes", "queue_depth"]

# Bytes of batches one queue (a worker's, or the sync bridge's) may hold beyond the
# depth asked for.
QUEUE_BYTES = 8 << 20
# No queue grows deeper than this, however small its batches.
MAX_DEPTH = 64


def batch_nbytes(batch: Any) -> int:
    """Roughly the bytes a batch holds (arrays, bytes and strings exactly; other objects by size)."""
    if isinstance(batch, np.ndarray):
        return int(batch.nbytes)
    if isinstance(batch, (bytes, bytearray, str)):
        return len(batch)
    if isinstance(batch, memoryview):
        return batch.nbytes
    if isinstance(batch, dict):
        return sum(batch_nbytes(v) for v in batch.values())
    if isinstance(batch, (list, tuple)):
        if batch and isinstance(batch[0], (str, bytes)):
            with contextlib.suppress(TypeError):  # (not all strings: each element on its own)
                return sum(map(len, batch))  # a column of strings or bytes, without a call per value
        return sum(batch_nbytes(v) for v in batch)
    nbytes = getattr(batch, "nbytes", None)  # framework tensors
    if isinstance(nbytes, int):
        return nbytes
    return sys.getsizeof(batch)


def queue_depth(asked: int, first_batch: Any) -> int:
    """The depth of a queue whose first batch is ``first_batch``: ``asked`` or more."""
    size = max(1, batch_nbytes(first_batch))
    return max(asked, min(MAX_DEPTH, QUEUE_BYTES // size))
