"""The shards a process reads: open memory maps, their resident pages, and leases.

:class:`OpenShards` keeps this process's shard readers open (read-only memory maps) in
LRU order; :func:`drop_pages` hands a map's touched pages back to the kernel (they stay
in the page cache); :func:`leases_of` groups a worker's sequence into the stretches for
which each shard is pinned (see :mod:`astream._dataset.reader`).
"""

from __future__ import annotations

import contextlib
import mmap
from collections import OrderedDict
from collections.abc import Iterable

import numpy as np
import numpy.typing as npt

from astream._dataset.layout import SampleMap
from astream._format.shard import ShardReader

__all__ = ["RESIDENT_BUDGET", "OpenShards", "drop_pages", "leases_of"]

Int64Array = npt.NDArray[np.int64]

# Bytes read from mapped shards after which their touched pages are handed back.
RESIDENT_BUDGET = 32 << 20


def drop_pages(reader: ShardReader) -> None:
    """Unmap the pages of ``reader``'s file from this process (they stay in the page cache)."""
    buf = reader.buffer
    if isinstance(buf, mmap.mmap) and not buf.closed:
        with contextlib.suppress(OSError, ValueError):
            buf.madvise(mmap.MADV_DONTNEED)


def leases_of(shards: Int64Array, gap: int) -> tuple[Int64Array, Int64Array, Int64Array]:
    """Group the positions of each shard into leases.

    Args:
        shards: the shard of each position of the sequence.
        gap: occurrences of a shard at most this far apart share a lease.

    Returns:
        ``(shard, start, end)`` per lease, sorted by start; ``end`` is inclusive.
    """
    n = len(shards)
    if n == 0:
        empty = np.zeros(0, np.int64)
        return empty, empty, empty
    # Work on runs of one shard, not on positions: an unshuffled epoch of 200k samples is a
    # handful of runs (sorting every position took ~3 ms before the first batch). Positions
    # inside a run are 1 apart, so a run never splits; two runs of a shard share a lease
    # when the later one starts at most ``gap`` after the earlier one ends.
    change = np.flatnonzero(shards[1:] != shards[:-1]) + 1
    run_start = np.empty(len(change) + 1, np.int64)
    run_start[0] = 0
    run_start[1:] = change
    run_end = np.empty_like(run_start)
    run_end[:-1] = change - 1
    run_end[-1] = n - 1
    run_shard = shards[run_start]
    order = np.argsort(run_shard, kind="stable")  # by shard, then position (a stable sort keeps it)
    rs, rstart, rend = run_shard[order], run_start[order], run_end[order]
    new = np.ones(len(rs), bool)
    new[1:] = (rs[1:] != rs[:-1]) | (rstart[1:] - rend[:-1] > gap)
    first = np.flatnonzero(new)
    last = np.empty_like(first)
    last[:-1] = first[1:] - 1
    last[-1] = len(rs) - 1
    shard, start, end = rs[first], rstart[first], rend[last]
    by_start = np.argsort(start, kind="stable")
    return shard[by_start], start[by_start], end[by_start]


class OpenShards:
    """Readers of the shards this process reads, kept open (mmap) in LRU order."""

    def __init__(self, smap: SampleMap, max_open: int = 128) -> None:
        self._smap = smap
        self._max_open = max_open
        self._open: OrderedDict[int, ShardReader] = OrderedDict()

    def get(self, shard: int, path: str) -> ShardReader:
        reader = self._open.get(shard)
        if reader is not None:
            self._open.move_to_end(shard)
            return reader
        info = self._smap.indexes[self._smap.shard_stream[shard]].shards[self._smap.shard_local[shard]]
        reader = ShardReader.open(
            path, self._smap.layouts[shard], shard=info.index, expected_samples=info.samples
        )
        drop_pages(reader)  # opening read the first chunk of record heads
        self._open[shard] = reader
        while len(self._open) > self._max_open:
            # Dropped, not closed: a batch being decoded may still use it; the mapping
            # goes with the last reference.
            self._open.popitem(last=False)
        return reader

    def drop_pages(self, shards: Iterable[int]) -> None:
        """Hand back the touched pages of these shards (those still open)."""
        for shard in shards:
            reader = self._open.get(shard)
            if reader is not None:
                drop_pages(reader)

    def close(self) -> None:
        readers = list(self._open.values())
        self._open.clear()
        for reader in readers:
            with contextlib.suppress(Exception):
                reader.close()
