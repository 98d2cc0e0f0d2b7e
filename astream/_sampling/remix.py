"""The plan of an epoch whose mixture changed mid-epoch (issue 36), as a pure function.

An epoch is a list of *segments*: the first is a plain epoch of its mixture; each later
one took over at a position ``start`` (the ``sample_in_epoch`` of the state it resumed
from) with another mixture. :func:`mixed_plan` turns that history and the plan options
(whose ``sample_in_epoch`` counts from the epoch's start) into the plan of the current
segment, from the resume point on; every rank computes it alone, and the same history
gives the same plan on any world the canonical nodes allow.

What each segment delivered is recomputed, never stored: the world consumes a plan's
positions in the order of its partition's traversal (the canonical nodes interleaved,
see :mod:`astream._sampling.partition`), so segment ``j`` delivered the first
``start[j+1] - start[j]`` positions of that traversal, which the shuffle and the
resampling map to sample ids. A stream is known across mixtures by its key (the dataset
uses a digest of its shards), so a stream that continues keeps what it delivered.

A later segment draws only unseen samples (counts by :mod:`astream._sampling.remainder`),
gathers them shard by shard into shuffle units (the shuffle keeps shards together as in
a plain epoch) and is shuffled with a seed derived from the run's seed, the epoch and the
segment, then partitioned as a plain epoch of that size: a resume inside it is the plain
resume arithmetic (``drop_first``) applied to it. Only ``batching_method='random'``.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from itertools import pairwise

import numpy as np
from numpy.typing import NDArray

from astream._sampling.options import PlanOptions
from astream._sampling.partition import make_partition
from astream._sampling.plan import EpochPlan
from astream._sampling.remainder import remainder_counts
from astream._sampling.streams import Resampled, StreamSpec, StreamWeights, map_ids
from astream.errors import ConfigError

__all__ = ["Mixture", "RemainderPlan", "Seen", "Segment", "delivered", "mixed_plan", "seen_before", "segment_seed"]

Int64Array = NDArray[np.int64]
BoolArray = NDArray[np.bool_]
Seen = Mapping[str, BoolArray]  # per stream key, which of its samples the epoch delivered


@dataclass(frozen=True)
class Mixture:
    """One mixture of an epoch and the position it took over at.

    Attributes:
        keys: each stream's identity across mixtures (unique within the mixture).
        streams: each stream's shard sizes and weight (``proportion``/``repeat``/``choose``).
        epoch_size: the mixture's ``epoch_size`` (``None``: derived from the weights).
        start: samples the world consumed in this epoch before it took over (0 for the first).
    """

    keys: tuple[str, ...]
    streams: tuple[StreamSpec, ...]
    epoch_size: int | None = None
    start: int = 0

    def __post_init__(self) -> None:
        if len(self.keys) != len(self.streams):
            raise ConfigError(f"a mixture has {len(self.keys)} stream keys for {len(self.streams)} streams")
        if len(set(self.keys)) != len(self.keys):
            raise ConfigError(f"a mixture names a stream twice: {sorted(self.keys)}")
        if self.start < 0:
            raise ConfigError(f"a mixture's start must be >= 0, got {self.start}")


@dataclass(frozen=True)
class Segment:
    """What one segment of the epoch is made of, per stream of its mixture.

    Attributes:
        index: the segment's place in the epoch (0: the plain epoch of the first mixture).
        start: where it took over.
        size: samples it holds (its whole length, the resume point aside).
        unseen: each stream's samples not delivered before the segment started.
        wanted: what each stream's weight asked of the segment.
        counts: what each stream gives (``wanted``, capped by ``unseen``, excess shared).
    """

    index: int
    start: int
    size: int
    unseen: Int64Array = field(repr=False)
    wanted: Int64Array = field(repr=False)
    counts: Int64Array = field(repr=False)


class RemainderPlan(EpochPlan):
    """The plan of a later segment: an :class:`EpochPlan` over the segment's chosen samples.

    Everything an ``EpochPlan`` answers (``worker_ids``, ``worker_head``, ``rank_len``,
    ``shape``, ...) is about the segment, from the resume point on; ``segment`` says how it
    is made. An empty segment (the epoch was over when the mixture changed) yields nothing.
    """

    segment: Segment

    def _install(self, segment: Segment, pool: Int64Array, units: Int64Array, seed: int, drop: int) -> None:
        sizes = np.array([s.num_samples for s in self.streams], np.int64)
        n = segment.size
        share = segment.counts / n if n else np.zeros(len(sizes))
        self.segment = segment
        self.weights = StreamWeights(segment.counts, share, segment.counts / sizes, n)
        self.shuffle_seed, self.sample_in_epoch = seed, drop
        if self.shuffle_algo == "py1e" and n < self.num_canonical_nodes:
            self.shuffle_algo = "py1b"  # py1e needs a sample per canonical node; py1b is its block shuffle
        self._last_parts = None
        self.__dict__["resampled"] = Resampled(units, pool, 0)
        for cached in ("shuffle_ids", "partition", "_merged"):
            self.__dict__.pop(cached, None)
        if n:
            self.__dict__["partition"] = make_partition(
                self.partition_algo, n, self.num_canonical_nodes, self.num_physical_nodes, self.ranks_per_node,
                self.workers_per_rank, self.batch_size, drop, self.initial_physical_nodes,
            )
        elif drop:
            raise ConfigError(f"sample_in_epoch is {drop} samples past a change of mixture that ended the epoch")

    @property
    def shape(self) -> tuple[int, int, int, int, int]:
        if not self.segment.size:
            return self.num_physical_nodes, self.ranks_per_node, self.workers_per_rank, 0, self.batch_size
        return super().shape

    def work(self) -> Int64Array:
        if not self.segment.size:
            return np.zeros(self.shape, np.int64)
        return super().work()

    def worker_ids(self, node: int, local_rank: int, worker: int) -> Int64Array:
        if not self.segment.size:
            self._check_coords(node, local_rank, worker)
            return np.zeros(0, np.int64)
        return super().worker_ids(node, local_rank, worker)

    def worker_head(self, node: int, local_rank: int, worker: int, count: int) -> Int64Array:
        if not self.segment.size:
            return self.worker_ids(node, local_rank, worker)
        return super().worker_head(node, local_rank, worker, count)

    def worker_len(self, node: int, local_rank: int, worker: int) -> int:
        return super().worker_len(node, local_rank, worker) if self.segment.size else 0


def segment_seed(seed: int, epoch: int, index: int) -> int:
    """The seed of segment ``index`` (its counts' leftover, its picks, its shuffle)."""
    return int(np.random.SeedSequence([seed, epoch, index]).generate_state(1, np.uint32)[0])


def mixed_plan(history: Sequence[Mixture], options: PlanOptions, seen: Seen | None = None) -> EpochPlan:
    """The plan of the epoch's current (last) segment, from ``options.sample_in_epoch`` on.

    Args:
        history: the epoch's mixtures in order, the first starting at 0, starts not
            decreasing; the last is the one in force.
        options: the plan options; ``sample_in_epoch`` counts from the epoch's start and
            must not be before the last mixture's start. Their ``epoch_size`` is ignored:
            each mixture carries its own.
        seen: :func:`seen_before` of this history and options, if already computed (it
            does not depend on the ranks per node, workers, batch size or position).

    Returns:
        A plain :class:`EpochPlan` for a history of one mixture, else a :class:`RemainderPlan`.

    Raises:
        ConfigError: a malformed history, a position past a segment's end, a batching
            method other than ``random``, or whatever the plain plans reject.
    """
    _check(history, options)
    last = history[-1]
    if len(history) == 1:
        return EpochPlan.of(last.streams, options.at(epoch_size=last.epoch_size))
    if seen is None:
        seen = seen_before(history, options)
    return _segment_plan(last, len(history) - 1, seen, options.at(sample_in_epoch=0, epoch_size=last.epoch_size),
                         options.sample_in_epoch - last.start)


def seen_before(history: Sequence[Mixture], options: PlanOptions) -> Seen:
    """What the epoch delivered before its last mixture took over: per stream key, a mask of
    its samples (the plans of the earlier segments replayed up to each change).

    Raises:
        ConfigError: a change past the end of the segment before it, or what the plans reject.
    """
    _check(history, options.at(sample_in_epoch=history[-1].start))
    seen: dict[str, BoolArray] = {}
    plan: EpochPlan = EpochPlan.of(history[0].streams, options.at(sample_in_epoch=0, epoch_size=history[0].epoch_size))
    for j in range(1, len(history)):
        before, now = history[j - 1], history[j]
        take = now.start - before.start
        if take > plan.epoch_size:
            raise ConfigError(
                f"the mixture changed at sample {now.start}, {take - plan.epoch_size} samples past the end of "
                f"segment {j - 1} (it held {plan.epoch_size} from sample {before.start})"
            )
        _mark(seen, before, delivered(plan, take))
        if j < len(history) - 1:
            plan = _segment_plan(now, j, seen, options.at(sample_in_epoch=0, epoch_size=now.epoch_size), 0)
    return seen


def delivered(plan: EpochPlan, count: int) -> Int64Array:
    """The sample ids of the first ``count`` positions the world consumes of ``plan``.

    ``plan`` must start at its segment's beginning (``sample_in_epoch=0``); ids repeat
    where the plan itself repeats (short canonical rows, repeat weights).
    """
    if count <= 0:
        return np.zeros(0, np.int64)
    # The traversal of the layout the partition deals from (private to the partition module,
    # but it is exactly "the order the world consumes positions", on any world it fits).
    positions = plan.partition._base.interleaved()[:count].copy()
    if plan.shuffle_ids is not None:
        map_ids(plan.shuffle_ids, positions)
    return plan.resampled.to_small(positions)


def _check(history: Sequence[Mixture], options: PlanOptions) -> None:
    if not history:
        raise ConfigError("a mixture history needs at least one mixture")
    if history[0].start:
        raise ConfigError(f"an epoch's first mixture starts at sample 0, not {history[0].start}")
    for before, now in pairwise(history):
        if now.start < before.start:
            raise ConfigError(f"mixture starts must not decrease: {before.start} then {now.start}")
    if options.sample_in_epoch < history[-1].start:
        raise ConfigError(
            f"sample_in_epoch={options.sample_in_epoch} is before the mixture in force took over "
            f"(sample {history[-1].start})"
        )
    if len(history) > 1 and options.batching_method != "random":
        raise ConfigError(
            f"a changed mixture is planned for batching_method='random' only, not {options.batching_method!r}"
        )


def _mark(seen: dict[str, BoolArray], mixture: Mixture, ids: Int64Array) -> None:
    """Record ``ids`` (global ids of ``mixture``'s streams) as delivered, per stream key."""
    sizes = [s.num_samples for s in mixture.streams]
    offsets = np.concatenate([np.zeros(1, np.int64), np.cumsum(sizes, dtype=np.int64)])
    ids = ids[ids >= 0]
    stream = np.searchsorted(offsets, ids, side="right") - 1
    for i, key in enumerate(mixture.keys):
        mask = seen.get(key)
        if mask is None:
            mask = seen[key] = np.zeros(sizes[i], bool)
        elif len(mask) != sizes[i]:
            raise ConfigError(f"stream {key} has {sizes[i]} samples in one mixture and {len(mask)} in another")
        mask[ids[stream == i] - offsets[i]] = True


def _segment_plan(mixture: Mixture, index: int, seen: Seen, options: PlanOptions,
                  drop: int) -> RemainderPlan:
    """The plan of segment ``index``: ``mixture``'s share of the unseen samples, from ``drop`` on."""
    plan = RemainderPlan.__new__(RemainderPlan)
    plan._setup(mixture.streams, options)  # (validates the mixture and the world)
    seed = segment_seed(options.shuffle_seed, options.epoch, index)
    rng = np.random.default_rng(seed)
    unseen_masks: list[BoolArray] = []
    for key, spec in zip(mixture.keys, mixture.streams, strict=True):
        mask = seen.get(key)
        if mask is not None and len(mask) != spec.num_samples:
            raise ConfigError(f"stream {key} has {spec.num_samples} samples in one mixture and {len(mask)} in another")
        unseen_masks.append(np.ones(spec.num_samples, bool) if mask is None else ~mask)
    unseen = np.array([int(m.sum()) for m in unseen_masks], np.int64)
    size = max(plan.weights.epoch_size - mixture.start, 0)
    wanted, counts = remainder_counts(size, plan.weights.proportion, unseen, rng)
    picks: list[Int64Array] = []
    for i, mask in enumerate(unseen_masks):
        ids = np.flatnonzero(mask).astype(np.int64)
        if counts[i] < len(ids) and options.shuffle:  # an even draw of the unseen, kept in order
            keep = np.zeros(len(ids), bool)
            keep[rng.choice(len(ids), int(counts[i]), False)] = True
            ids = ids[keep]
        elif counts[i] < len(ids):  # in order: the next unseen
            ids = ids[: counts[i]]
        picks.append(ids + plan.stream_offsets[i])
    pool = np.concatenate(picks) if picks else np.zeros(0, np.int64)
    # Shuffle units: the chosen samples of each shard, shards in order (as a plain epoch's).
    units = np.bincount(plan.shard_of(pool), minlength=len(plan.shard_bounds) - 1)
    units = units[units > 0]
    segment = Segment(index, mixture.start, int(counts.sum()), unseen, wanted, counts)
    plan._install(segment, pool, units.astype(np.int64), seed, drop)
    return plan
