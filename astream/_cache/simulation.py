"""The cache policy played through an epoch, without a cache: :func:`simulate` and its floor.

Split from :mod:`astream._cache.eviction` because the simulation is a client of the
policy, not part of it: it plays an epoch of the node through the same
:func:`~astream._cache.eviction.choose_victims` and :class:`~astream._cache.eviction.NodePlan`
the cache uses (readers in lockstep, one batch at a time, a prefetch window of
``predownload`` positions), and :func:`offline_optimum` gives Belady with unlimited
look-ahead over the node's whole plan. The tests, the cache benchmark and the epoch
forecast compare real runs with both. Pure: no I/O, no clock.
"""

from __future__ import annotations

import bisect
import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import cast

import numpy as np

from astream._cache.eviction import NEVER, Candidate, Int64Array, NodePlan, choose_victims, runs_of
from astream.errors import CacheError

__all__ = ["SimResult", "SimTrace", "offline_optimum", "simulate"]


@dataclass(frozen=True)
class SimResult:
    """What an epoch through a cache policy costs.

    Attributes:
        downloads: shard transfers (first downloads and re-downloads).
        bytes_downloaded: their bytes.
        evictions: shards deleted to make room.
        peak: the most bytes held at once (reserved ones included).
    """

    downloads: int
    bytes_downloaded: int
    evictions: int
    peak: int


@dataclass
class SimTrace:
    """Step by step, what a simulation did (for forecasts and plots).

    Attributes:
        downloads: per step, the shards downloaded in it (for the step's batches, then
            prefetches), in order.
        evictions: per step, the shards evicted in it.
        held: per step, the bytes the cache holds at its end.
        keys: per step, the shards the step's batches read (every reader's).
    """

    downloads: list[list[int]] = field(default_factory=list)
    evictions: list[int] = field(default_factory=list)
    held: list[int] = field(default_factory=list)
    keys: list[list[int]] = field(default_factory=list)


def _batches(order: Int64Array, batch_size: int, t: int) -> Int64Array:
    return order[t * batch_size : (t + 1) * batch_size]


class _Residency:
    """What a simulated cache holds, and the transfers and evictions that got it there."""

    def __init__(self, sizes: Sequence[int], resident: Iterable[int], trace: SimTrace | None = None) -> None:
        self.sizes = sizes
        self.trace = trace
        self.held: set[int] = set(resident)
        self.used = sum(sizes[k] for k in self.held)
        self.downloads = self.evictions = self.got = 0
        self.peak = self.used

    def admit(self, key: int, victims: Sequence[int]) -> None:
        """Evict ``victims``, then download ``key``."""
        for v in victims:
            self.held.discard(v)
            self.used -= self.sizes[v]
        self.evictions += len(victims)
        self.held.add(key)
        self.used += self.sizes[key]
        self.downloads += 1
        self.got += self.sizes[key]
        self.peak = max(self.peak, self.used)
        if self.trace is not None:
            self.trace.downloads[-1].append(key)
            self.trace.evictions[-1] += len(victims)

    def step(self, keys: Iterable[int]) -> None:
        """A step begins; its batches read ``keys``."""
        if self.trace is not None:
            self.trace.downloads.append([])
            self.trace.evictions.append(0)
            self.trace.keys.append(sorted(keys))

    def stepped(self) -> None:
        """The step ends."""
        if self.trace is not None:
            self.trace.held.append(self.used)

    def result(self) -> SimResult:
        return SimResult(self.downloads, self.got, self.evictions, self.peak)


def simulate(
    orders: Sequence[Int64Array], sizes: Sequence[int], limit: int, *, batch_size: int, predownload: int,
    resident: Iterable[int] = (), trace: SimTrace | None = None,
) -> SimResult:
    """Play one epoch of the node through the plan-aware policy.

    Args:
        orders: per reader, the shard of each position it reads, in order.
        sizes: bytes of each shard on disk.
        limit: the cache limit.
        batch_size: positions a reader reads at once (its batch's shards are pinned).
        predownload: how far ahead of its position each reader's shards are prefetched;
            at most ``batch_size`` means no prefetch beyond the current batch.
        resident: shards in the cache at the start.
        trace: filled in step by step, if given.

    Raises:
        CacheError: ``limit`` cannot hold a step's batches (it is below :func:`min_cache_bytes`).

    Returns:
        The transfers, evictions and peak. Readers advance in lockstep, one batch each in
        turn; each batch's missing shards are fetched in order of first use, evicting the
        farthest-next-use unpinned shard; then each reader's window is prefetched, nearest
        first, while the shards Belady would drop when each is read are not read before.
    """
    plan = NodePlan()
    for r, order in enumerate(orders):
        keys, starts, ends = runs_of(np.asarray(order, np.int64))
        plan.add(r, keys.tolist(), starts.tolist(), ends.tolist())
    book = _Residency(sizes, resident, trace)
    held = book.held

    def fetch(key: int, pinned: set[int], ahead: float | None) -> bool:
        cands = [Candidate(k, sizes[k], 0, pinned=k in pinned, next_use=plan.distance(k, ahead or 0),
                           soon=ahead is not None and plan.distance(k) < ahead) for k in sorted(held)]
        victims = choose_victims(cands, book.used, sizes[key], limit)
        if victims is None:
            return False
        book.admit(key, victims)
        return True

    steps = max((math.ceil(len(o) / batch_size) for o in orders), default=0)
    for t in range(steps):
        for r in range(len(orders)):
            plan.advance(r, t * batch_size)
        pinned: set[int] = set()
        for order in orders:
            batch = _batches(np.asarray(order, np.int64), batch_size, t)
            pinned.update(int(k) for k in batch)
        book.step(pinned)
        for order in orders:
            batch = _batches(np.asarray(order, np.int64), batch_size, t)
            for key in dict.fromkeys(int(k) for k in batch):
                if key not in held and not fetch(key, pinned, None):
                    raise CacheError(f"cache_limit={limit} bytes cannot hold step {t}'s batches of every reader "
                                     f"(shards {sorted(pinned)}); it is below min_cache_bytes")
        if predownload > batch_size:
            for d, upcoming in plan.upcoming(predownload):
                k = cast(int, upcoming)
                if k not in held and not fetch(k, pinned, d):
                    break
        book.stepped()
    return book.result()


def offline_optimum(orders: Sequence[Int64Array], sizes: Sequence[int], limit: int, *, batch_size: int,
                    resident: Iterable[int] = ()) -> SimResult:
    """Belady with unlimited look-ahead over the node's whole plan (readers in lockstep).

    The node's uses are merged into one sequence (batch by batch, reader by reader); on a
    miss the resident shard whose next use in that sequence is farthest is evicted,
    never one of the current step's batches.
    """
    arrays = [np.asarray(o, np.int64) for o in orders]
    steps = max((math.ceil(len(o) / batch_size) for o in arrays), default=0)
    sequence: list[tuple[int, int]] = []  # (step, key)
    for t in range(steps):
        for order in arrays:
            sequence.extend((t, key) for key in dict.fromkeys(int(k) for k in _batches(order, batch_size, t)))
    positions: dict[int, list[int]] = {}
    for i, (_, key) in enumerate(sequence):
        positions.setdefault(key, []).append(i)
    book = _Residency(sizes, resident)
    held = book.held
    step_start = 0
    for i, (t, key) in enumerate(sequence):
        if i == 0 or sequence[i - 1][0] != t:
            step_start = i
        if key in held:
            continue
        pinned = {k for s, k in sequence[step_start:i] if s == t}

        def next_use(k: int, i: int = i) -> float:
            pos = positions.get(k, [])
            j = bisect.bisect_left(pos, i)
            return pos[j] - i if j < len(pos) else NEVER

        cands = [Candidate(k, sizes[k], 0, pinned=k in pinned, next_use=next_use(k)) for k in sorted(held)]
        victims = choose_victims(cands, book.used, sizes[key], limit)
        if victims is None:
            raise CacheError(f"cache_limit={limit} bytes cannot hold step {t}'s batches of every reader; "
                             "it is below min_cache_bytes")
        book.admit(key, victims)
    return book.result()
