"""``LeaseBook``: one reader's leases, which to ask for next, and which to release.

A *lease* is a stretch of the reader's sequence where one shard is read: occurrences of
a shard closer together than the look-ahead share one (:func:`leases_of`), so a shard is
pinned once for the stretch, not once per sample. The book decides, without I/O:

- the request order: leases in order of their start, each asked for once the consumer
  is within reach of it (``predownload`` positions; with a bounded cache, the batch about
  to be read: a lease is then one run of a shard, so no pin outlives its batch), a lease
  passed before it was asked for skipped (a worker that starts mid-way);
- the ``first`` mark: a lease the next read needs (at the start of an iteration, its
  first batch) is asked for as such, and the node serves those of all its readers first;
- the releases: a granted lease is released once the consumer has passed its end.

Bounded versus unbounded is this one policy, chosen when the book is made. The reader
(:mod:`astream._dataset.read.reader`) is the I/O shell: it sends the requests the book
names, and tells it what was granted and how far the consumer got.
"""

from __future__ import annotations

import heapq

import numpy as np
import numpy.typing as npt

__all__ = ["LeaseBook", "leases_of"]

Int64Array = npt.NDArray[np.int64]


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


class LeaseBook:
    """The leases of one reader's sequence and where their requests stand.

    Args:
        shards: the shard of each position of the sequence.
        predownload: positions ahead of the consumer a lease is asked for (unbounded).
        read_size: positions one read takes at most (a batch): the reach of ``first``.
        bounded: the node's cache has a limit: one lease per run, asked for once the batch
            it starts in is next.
    """

    def __init__(self, shards: Int64Array, predownload: int, read_size: int, bounded: bool) -> None:
        self.shard, self.start, self.end = leases_of(shards, 0 if bounded else predownload)
        self._reach = read_size - 1 if bounded else predownload
        self._read_size = read_size
        self.issued = 0  # leases asked for (or skipped) so far, in order
        self.consumed = 0  # the consumer finished every position before this one
        self._releases: list[tuple[int, int]] = []  # heap of (end, lease) of granted leases
        self.held: set[int] = set()

    def __len__(self) -> int:
        return len(self.shard)

    def all_issued(self) -> bool:
        return self.issued >= len(self.shard)

    def due(self) -> bool:
        """Whether the next lease may be asked for now (its start within reach)."""
        return not self.all_issued() and int(self.start[self.issued]) <= self.consumed + self._reach

    def next_passed(self) -> bool:
        """Whether the next lease ends before the consumer's position (no request: skip it)."""
        return int(self.end[self.issued]) < self.consumed

    def skip(self) -> int:
        """The next lease, passed: counted as issued, never asked for."""
        lease = self.issued
        self.issued += 1
        return lease

    def issue(self) -> tuple[int, bool]:
        """The next lease to ask for, and whether it is ``first`` (the next read needs it)."""
        lease = self.issued
        self.issued += 1
        return lease, bool(self.start[lease] < self.consumed + self._read_size)

    def granted(self, lease: int) -> None:
        """``lease``'s shard is held (pinned) for this reader until its end is passed."""
        self.held.add(lease)
        heapq.heappush(self._releases, (int(self.end[lease]), lease))

    def advance(self, position: int) -> None:
        """The consumer finished every position before ``position``."""
        self.consumed = position

    def next_release(self) -> int | None:
        """A granted lease whose end the consumer has passed, no longer held (None: none)."""
        if self._releases and self._releases[0][0] < self.consumed:
            _, lease = heapq.heappop(self._releases)
            self.held.discard(lease)
            return lease
        return None

    def release_all(self) -> list[int]:
        """Every lease still held (the reader closes), in order; the book holds none after."""
        out = sorted(self.held)
        self.held.clear()
        self._releases.clear()
        return out
