"""The eviction policy, as pure functions (no I/O, no clock).

Two choices, both here so they can be tested without a cache:

- :func:`choose_victims` — which shards to delete to make room. Without a plan, least
  recently used first; with one, the shard whose next use on the node is farthest
  (never used again first: Belady's choice, made with the look-ahead the epoch plan gives).
  Never a pinned shard (being read) and never one that is not ours to delete (its only
  copy is local). A prefetch of a shard read ``d`` positions ahead ranks the residents by
  their next use after ``d`` and marks those read before ``d`` as ``soon``: if the shard
  Belady would drop at ``d`` is read before then, there is no room *yet* (conservative
  prefetching: the prefetch costs no transfer Belady would not make).
- :class:`NodePlan` — the node's readers' shard uses (runs of positions per reader) and
  where each reader is; it answers "how far away is the next use of this shard?".

:func:`~astream._cache.simulation.simulate` plays an epoch through that policy and
:func:`~astream._cache.simulation.offline_optimum` gives Belady with unlimited look-ahead
(:mod:`astream._cache.simulation`). :func:`min_cache_bytes` is the smallest limit
that can never deadlock: every reader's batch held at once, plus one shard for random
access beside the iteration.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Hashable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import cast

import numpy as np
import numpy.typing as npt

__all__ = [
    "Candidate",
    "NodePlan",
    "choose_victims",
    "min_cache_bytes",
    "runs_of",
]

Int64Array = npt.NDArray[np.int64]
NEVER = math.inf


@dataclass(frozen=True)
class Candidate:
    """One resident shard as the eviction policy sees it.

    ``next_use`` is how many positions away the node reads it next (``inf``: never again
    this epoch), or None where no plan is known (then ``last_used`` decides).
    """

    key: int
    size: int
    last_used: int
    pinned: bool = False
    evictable: bool = True
    next_use: float | None = None
    soon: bool = False  # read before the shard a prefetch fetches: it may not go for it


def choose_victims(candidates: Iterable[Candidate], used: int, need: int, limit: int | None) -> list[int] | None:
    """Pick shards to evict so that ``used - freed + need <= limit``.

    Args:
        candidates: the resident shards.
        used: bytes the cache holds now (resident plus reserved).
        need: bytes about to be added.
        limit: the cache limit, or None for no limit.

    Returns:
        Keys to evict in order — farthest next use first where known (ties by key), else
        least recently used first — empty if nothing needs to go, or None if evicting
        every allowed shard would not make enough room, or if one that would have to go
        is ``soon``.
    """
    if limit is None or used + need <= limit:
        return []
    excess = used + need - limit
    victims: list[int] = []

    def order(c: Candidate) -> tuple[float, int, int]:
        if c.next_use is None:
            return (0.0, c.last_used, c.key)
        return (-c.next_use, 0, c.key)

    for cand in sorted(candidates, key=order):
        if cand.soon:
            return None  # Belady would drop this one, but not before it is read (pinned: now)
        if cand.pinned or not cand.evictable or cand.size <= 0:
            continue
        victims.append(cand.key)
        excess -= cand.size
        if excess <= 0:
            return victims
    return None


def runs_of(shards: Int64Array) -> tuple[Int64Array, Int64Array, Int64Array]:
    """Runs of equal shards in a sequence: ``(shard, start, end)`` per run, ``end`` inclusive."""
    n = len(shards)
    if n == 0:
        empty = np.zeros(0, np.int64)
        return empty, empty, empty
    change = np.flatnonzero(shards[1:] != shards[:-1]) + 1
    start = np.concatenate([np.zeros(1, np.int64), change]).astype(np.int64)
    end = np.concatenate([change - 1, np.array([n - 1])]).astype(np.int64)
    return np.asarray(shards, np.int64)[start], start, end


@dataclass
class _Reader:
    runs: dict[Hashable, tuple[list[int], list[int]]]  # key -> (starts, ends), by start
    length: int
    window: int
    position: int = 0
    # All runs in order (they do not overlap): what lies ahead is a bisect and a short walk.
    starts: list[int] = field(default_factory=list)
    ends: list[int] = field(default_factory=list)
    keys: list[Hashable] = field(default_factory=list)

    def append(self, key: Hashable, start: int, end: int) -> None:
        s, e = self.runs.setdefault(key, ([], []))
        s.append(start)
        e.append(end)
        self.starts.append(start)
        self.ends.append(end)
        self.keys.append(key)
        self.length = max(self.length, end + 1)


@dataclass
class NodePlan:
    """The shard uses of every reader on the node, and how far each has come.

    Keys are whatever the caller uses for a shard (an int, a ``(stream, shard)`` pair).
    Positions count a reader's own samples; distances of several readers are compared as
    they are (readers of one node advance at about the same pace).
    """

    readers: dict[Hashable, _Reader] = field(default_factory=dict)

    def add(self, reader: Hashable, keys: Sequence[Hashable], starts: Sequence[int], ends: Sequence[int],
            *, window: int = 0, position: int = 0) -> None:
        """Register (or replace) ``reader``: it uses ``keys[j]`` at positions ``starts[j]..ends[j]``
        and wants what it reads within ``window`` positions of where it is downloaded ahead."""
        r = self.readers[reader] = _Reader({}, 0, window, position)
        for key, a, b in sorted(zip(keys, starts, ends, strict=True), key=lambda u: u[1]):
            r.append(key, int(a), int(b))

    def extend(self, reader: Hashable, keys: Sequence[Hashable], starts: Sequence[int], ends: Sequence[int]) -> None:
        """More uses of ``reader``, all starting after those it has (its plan in parts)."""
        r = self.readers.get(reader)
        if r is None:
            return
        for key, a, b in sorted(zip(keys, starts, ends, strict=True), key=lambda u: u[1]):
            r.append(key, int(a), int(b))

    def remove(self, reader: Hashable) -> None:
        self.readers.pop(reader, None)

    def advance(self, reader: Hashable, position: int) -> None:
        """``reader`` has consumed everything before ``position``."""
        r = self.readers.get(reader)
        if r is not None:
            r.position = max(r.position, position)

    def distance(self, key: Hashable, after: float = 0) -> float:
        """Positions until the node next reads ``key`` (0: now), ``inf`` if never this epoch.

        With ``after``: its first read at least ``after`` positions from now (how Belady
        would rank it when a shard read that far ahead comes in).
        """
        best = NEVER
        if after == NEVER:
            return NEVER
        skip = math.ceil(after)
        for r in self.readers.values():
            runs = r.runs.get(key)
            if runs is None:
                continue
            starts, ends = runs
            at = r.position + skip
            j = bisect.bisect_left(ends, at)
            if j < len(ends):
                d = max(starts[j], at) - r.position
                if d < best:
                    best = d
        return best

    def upcoming(self, window: int | None = None) -> list[tuple[float, Hashable]]:
        """Keys some reader uses within ``window`` positions (default: its own) of where it
        is, nearest first."""
        best: dict[Hashable, float] = {}
        for r in self.readers.values():
            lo, hi = r.position, r.position + (r.window if window is None else window)
            j = bisect.bisect_left(r.ends, lo)
            while j < len(r.starts) and r.starts[j] < hi:
                key = r.keys[j]
                d = max(r.starts[j], lo) - lo
                if d < best.get(key, NEVER):
                    best[key] = d
                j += 1
        return sorted(((d, k) for k, d in best.items()), key=lambda x: (x[0], _sort_key(x[1])))


def _sort_key(key: Hashable) -> tuple[int, ...]:
    if isinstance(key, tuple):
        return tuple(int(k) for k in key)
    return (cast(int, key),)


def min_cache_bytes(footprints: Sequence[int], batch_size: int, readers: int) -> int:
    """The smallest cache limit under which no reader can wait forever.

    Every reader may hold one batch's shards at once (at most ``batch_size`` distinct
    ones, at worst the largest), and a random access (``ds[i]``) beside the iteration
    one more shard.
    """
    if not footprints:
        return 0
    top = sorted(footprints, reverse=True)[: max(1, batch_size)]
    return readers * sum(top) + top[0]
