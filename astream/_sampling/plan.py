"""``EpochPlan``: which sample ids every worker of every rank yields in one epoch.

Given the streams' shard sizes and weights, the sampling knobs, the world shape, the
epoch and the resumption offset, an :class:`EpochPlan` resolves MosaicML's defaults and
computes MosaicML's ``generate_work`` tensor, either whole (:meth:`EpochPlan.work`) or for
one worker (:meth:`EpochPlan.worker_ids`), which for ``random`` batching costs the
epoch's shuffle plus O(that worker's share) instead of several O(epoch) tensors. The
merged batching methods' tensor is computed in :mod:`.merged`; the function
``plan_epoch`` is in :mod:`.work`.
"""

from __future__ import annotations

import hashlib
import math
from collections.abc import Mapping, Sequence
from functools import cached_property
from typing import Any

import numpy as np
from numpy.typing import NDArray

from astream._arrays import sorted_unique
from astream._sampling import defaults
from astream._sampling.merged import merged_work
from astream._sampling.options import PlanOptions
from astream._sampling.order import rank_batches
from astream._sampling.partition import Partition, layout_world, make_partition
from astream._sampling.shuffle import ShuffleParts, get_shuffle, shuffle_parts
from astream._sampling.streams import (
    Resampled,
    StreamSpec,
    StreamWeights,
    apply_weights,
    map_ids,
    resample,
    stream_spec,
)
from astream.errors import ConfigError

__all__ = ["EpochPlan", "stream_spec"]

Int64Array = NDArray[np.int64]


class EpochPlan:
    """The sample order of one epoch for a whole world, identical to MosaicML Streaming's.

    Args:
        streams: each stream's shard sizes and optional ``proportion``/``repeat``/``choose``.
        shuffle: whether to shuffle.
        shuffle_algo: ``naive``, ``py1b``, ``py1br``, ``py1e``, ``py1s`` or ``py2s``.
        shuffle_seed: run-wide seed (>= 0).
        num_canonical_nodes: ``None`` (or 0) for MosaicML's default (spec 4.6).
        shuffle_block_size: ``None`` for ``max(4_000_000 // ncn, 1 << 18)``.
        partition_algo: ``orig`` or ``relaxed``.
        batch_size: per-device batch size (required, as MosaicML requires it to iterate).
        num_physical_nodes: nodes P.
        ranks_per_node: ranks per node R.
        workers_per_rank: loader workers per rank W (1 for direct iteration).
        epoch: the epoch (>= 0).
        sample_in_epoch: samples the whole world already consumed (resumption).
        initial_physical_nodes: node count of the first run (from the resumption state).
        epoch_size: samples per epoch (an int or ``"64M"``); only with relative weights.
        sampling_method: ``balanced`` or ``fixed``.
        sampling_granularity: samples per pick when a shard is partly drawn.
        batching_method: ``random``, ``stratified``, ``per_stream`` or ``device_per_stream``.

    Raises:
        ConfigError: any parameter MosaicML would reject (before any work is done).

    The resolved values are attributes (``num_canonical_nodes``, ``shuffle_block_size``,
    ``epoch_size``, ``weights``, ``state_initial_physical_nodes``); ``rank_len`` is
    ``len(dataset)`` per rank. :meth:`worker_ids` gives one worker's ids (for ``random``
    batching without building the whole tensor: a plan kept per node serves all its
    workers), :meth:`rank_order` what a rank's loader yields, :meth:`work` the whole tensor.

    Example::

        plan = EpochPlan([{"shard_sizes": [100, 250, 7]}], shuffle=True, batch_size=4,
                         num_physical_nodes=2, ranks_per_node=8, workers_per_rank=4, epoch=3)
        ids = plan.worker_ids(node=1, local_rank=5, worker=2)  # -1 marks padding
    """

    def __init__(
        self,
        streams: Sequence[StreamSpec | Mapping[str, Any]],
        *,
        shuffle: bool = False,
        shuffle_algo: str = defaults.DEFAULT_SHUFFLE_ALGO,
        shuffle_seed: int = defaults.DEFAULT_SHUFFLE_SEED,
        num_canonical_nodes: int | None = None,
        shuffle_block_size: int | None = None,
        partition_algo: str = defaults.DEFAULT_PARTITION_ALGO,
        batch_size: int,
        num_physical_nodes: int = 1,
        ranks_per_node: int = 1,
        workers_per_rank: int = 1,
        epoch: int = 0,
        sample_in_epoch: int = 0,
        initial_physical_nodes: int | None = None,
        epoch_size: int | str | None = None,
        sampling_method: str = defaults.DEFAULT_SAMPLING_METHOD,
        sampling_granularity: int = defaults.DEFAULT_SAMPLING_GRANULARITY,
        batching_method: str = defaults.DEFAULT_BATCHING_METHOD,
    ) -> None:
        self._setup(streams, PlanOptions(
            batch_size=batch_size, shuffle=shuffle, shuffle_algo=shuffle_algo, shuffle_seed=shuffle_seed,
            num_canonical_nodes=num_canonical_nodes, shuffle_block_size=shuffle_block_size,
            partition_algo=partition_algo, num_physical_nodes=num_physical_nodes, ranks_per_node=ranks_per_node,
            workers_per_rank=workers_per_rank, epoch=epoch, sample_in_epoch=sample_in_epoch,
            initial_physical_nodes=initial_physical_nodes, epoch_size=epoch_size, sampling_method=sampling_method,
            sampling_granularity=sampling_granularity, batching_method=batching_method,
        ))

    @classmethod
    def of(cls, streams: Sequence[StreamSpec | Mapping[str, Any]], options: PlanOptions) -> EpochPlan:
        """The plan of ``streams`` under validated ``options`` (what the keywords build)."""
        plan = cls.__new__(cls)
        plan._setup(streams, options)
        return plan

    def _setup(self, streams: Sequence[StreamSpec | Mapping[str, Any]], o: PlanOptions) -> None:
        self.options = o
        self.shuffle, self.shuffle_algo, self.shuffle_seed = o.shuffle, o.shuffle_algo, o.shuffle_seed
        self.partition_algo, self.batch_size = o.partition_algo, o.batch_size
        self.num_physical_nodes, self.ranks_per_node = o.num_physical_nodes, o.ranks_per_node
        self.workers_per_rank, self.epoch, self.sample_in_epoch = o.workers_per_rank, o.epoch, o.sample_in_epoch
        self.initial_physical_nodes = o.initial_physical_nodes
        self.sampling_method, self.sampling_granularity = o.sampling_method, o.sampling_granularity
        self.batching_method = o.batching_method
        self.num_canonical_nodes, self.shuffle_block_size = o.resolved_ncn, o.resolved_block
        self.streams = [stream_spec(s) for s in streams]
        self.weights: StreamWeights = apply_weights(self.streams, o.given_epoch_size, self.shuffle_seed)
        sizes = [s.num_samples for s in self.streams]
        self.stream_offsets: list[int] = [0, *np.cumsum(sizes).tolist()][:-1]
        self.num_samples = int(sum(sizes))
        # Per-shard counts change by epoch only when shuffling with balanced sampling (#750).
        self.epoch_seed_change = self.shuffle and self.sampling_method == "balanced"
        self._last_parts: tuple[dict[int, int], ShuffleParts] | None = None
        # Where each canonical node's shuffle draws begin, as far as known (computed here, or
        # given: states kept under :attr:`shuffle_key` by another process of the node). A
        # rank then starts at its own canonical node instead of making every earlier one's
        # draws.
        self.node_states: dict[int, dict[str, Any]] = {}
        self._check_world()

    def _check_world(self) -> None:
        """Reject a world the canonical nodes cannot be laid out over, before any work."""
        c, p = self.num_canonical_nodes, self.num_physical_nodes
        if self.batching_method == "random":
            _ = self.partition  # also checks sample_in_epoch against the epoch
        elif self.batching_method == "per_stream":
            layout_world(self.partition_algo, c, p, self.ranks_per_node, self.batch_size,
                         self.initial_physical_nodes)
        elif self.batching_method == "device_per_stream" and c % p:
            raise ConfigError(
                f"batching_method='device_per_stream' needs num_canonical_nodes ({c}) divisible by "
                f"num_physical_nodes ({p})"
            )

    # --- resolved values -------------------------------------------------------------------

    @property
    def epoch_size(self) -> int:
        """Samples drawn per epoch, summed over streams."""
        return self.weights.epoch_size

    @property
    def num_ranks(self) -> int:
        """Ranks in the (parallel) world."""
        return self.num_physical_nodes * self.ranks_per_node

    @property
    def rank_len(self) -> int:
        """``len(dataset)`` on each rank: ``ceil(epoch_size / num_ranks)`` (padding aside)."""
        return math.ceil(self.epoch_size / self.num_ranks)

    @property
    def shape(self) -> tuple[int, int, int, int, int]:
        """``(nodes, ranks per node, workers per rank, batches per worker, batch size)``."""
        if self.batching_method == "random":
            return self.partition.shape
        nodes, ranks, workers, batches, size = self._merged.shape
        return nodes, ranks, workers, batches, size

    @property
    def state_initial_physical_nodes(self) -> int:
        """``initial_physical_nodes`` for a resumption state: the first run's node count."""
        return self.num_physical_nodes if self.initial_physical_nodes is None else self.initial_physical_nodes

    @cached_property
    def shard_bounds(self) -> Int64Array:
        """Global id of the first sample of every shard (streams in order), plus the total."""
        sizes = np.concatenate([s.shard_sizes for s in self.streams])
        return np.concatenate([np.zeros(1, np.int64), np.cumsum(sizes, dtype=np.int64)])

    def shard_of(self, sample_ids: Int64Array) -> Int64Array:
        """Global shard index of each sample id (``-1`` stays ``-1``); empty shards never match."""
        ids = np.asarray(sample_ids, np.int64)
        shards = np.searchsorted(self.shard_bounds, ids, side="right") - 1
        return np.where(ids >= 0, shards, -1).astype(np.int64, copy=False)

    # --- the random batching path -------------------------------------------------------------

    @cached_property
    def resampled(self) -> Resampled:
        """All streams resampled together (one generator for their partial repeats)."""
        return self._resample(range(len(self.streams)))

    @cached_property
    def partition(self) -> Partition:
        """The lazy partition of the epoch's positions over the world."""
        return make_partition(
            self.partition_algo, self.epoch_size, self.num_canonical_nodes, self.num_physical_nodes,
            self.ranks_per_node, self.workers_per_rank, self.batch_size, self.sample_in_epoch,
            self.initial_physical_nodes,
        )

    @cached_property
    def shuffle_ids(self) -> Int64Array | None:
        """The epoch's shuffle of positions (``None`` without shuffling); computed once."""
        if not self.shuffle:
            return None
        return get_shuffle(self.shuffle_algo, self.resampled.units, self.num_canonical_nodes,
                           self.shuffle_seed, self.epoch, self.shuffle_block_size)

    def _to_ids(self, positions: Int64Array, resampled: Resampled, shuffle: Int64Array | None) -> Int64Array:
        """Map partition positions to global sample ids in place (``-1`` kept)."""
        if shuffle is not None:
            map_ids(shuffle, positions)
        return resampled.to_small(positions)

    # --- public queries -------------------------------------------------------------------------

    def work(self) -> Int64Array:
        """The whole epoch tensor, as MosaicML's ``generate_work`` returns it (a fresh array)."""
        if self.batching_method != "random":
            return np.array(self._merged, np.int64)
        return self._to_ids(self.partition.array(), self.resampled, self.shuffle_ids)

    def _check_coords(self, node: int, local_rank: int, worker: int) -> None:
        for name, value, bound in (
            ("node", node, self.num_physical_nodes),
            ("local_rank", local_rank, self.ranks_per_node),
            ("worker", worker, self.workers_per_rank),
        ):
            if not 0 <= value < bound:
                raise ConfigError(f"{name}={value} is outside the world (0 <= {name} < {bound})")

    def worker_ids(self, node: int, local_rank: int, worker: int) -> Int64Array:
        """One worker's sample ids in order, ``-1`` for padding (``work[node, rank, worker]``).

        Raises:
            ConfigError: coordinates outside the world.
        """
        self._check_coords(node, local_rank, worker)
        if self.batching_method != "random":
            return np.array(self._merged[node, local_rank, worker].reshape(-1), np.int64)
        positions = self.partition.worker(node, local_rank, worker)
        parts = self._worker_shuffle(positions)
        if parts is not None:
            parts.map_positions(positions)
        return self.resampled.to_small(positions)

    def rank_ids(self, node: int, local_rank: int) -> Int64Array:
        """One rank's ids, ``work[node, local_rank]`` (shape ``(workers, batches, batch)``),
        computed from that rank's share alone: its partition entries, and of the shuffle only
        the canonical nodes its workers read, from the first position any of them uses (one
        shuffle for all its workers). Memory grows with the rank's share, not the world's;
        time too, but for the draws of the canonical nodes before its own, which a
        shuffle's definition makes sequential (see :mod:`astream._sampling.shuffle.nodes`).

        Raises:
            ConfigError: coordinates outside the world.
        """
        self._check_coords(node, local_rank, 0)
        _, _, workers, batches, size = self.shape
        if self.batching_method != "random":
            return np.array(self._merged[node, local_rank], np.int64)
        positions = np.concatenate([self.partition.worker(node, local_rank, w) for w in range(workers)])
        parts = self._worker_shuffle(positions)
        if parts is not None:
            parts.map_positions(positions)
        return self.resampled.to_small(positions).reshape(workers, batches, size)

    def worker_head(self, node: int, local_rank: int, worker: int, count: int) -> Int64Array:
        """The first ``count`` ids of :meth:`worker_ids`, padding dropped (fewer if it has fewer).

        A resume's first batch, wanted before anything else: without a shuffle only the
        partition's batches that hold them are computed, not the rest of the epoch (a
        shuffle's parts depend on every position the worker uses: there, the whole worker).

        Raises:
            ConfigError: coordinates outside the world.
        """
        if self.shuffle or self.batching_method != "random":
            ids = self.worker_ids(node, local_rank, worker)
            return ids[ids >= 0][:count]
        self._check_coords(node, local_rank, worker)
        batches, size = self.partition.shape[3], self.partition.shape[4]
        parts: list[Int64Array] = []
        have, hi = 0, 0
        while have < count and hi < batches:
            lo, hi = hi, min(batches, hi + max(1, -(-(count - have) // size)))  # the batches that could hold the rest
            ids = self.resampled.to_small(self.partition.worker_batches(node, local_rank, worker, lo, hi))
            ids = ids[ids >= 0]
            parts.append(ids)
            have += len(ids)
        return np.concatenate(parts)[:count] if parts else np.zeros(0, np.int64)

    def worker_len(self, node: int, local_rank: int, worker: int) -> int:
        """How many ids (padding aside) :meth:`worker_ids` returns, without shuffling."""
        if self.batching_method != "random":
            return int((self._merged[node, local_rank, worker] >= 0).sum())
        return int((self.partition.worker(node, local_rank, worker) >= 0).sum())

    def _worker_shuffle(self, positions: Int64Array) -> ShuffleParts | None:
        """The shuffle's slices for these positions' canonical nodes (whole if already made).

        A worker's positions come from few canonical nodes (one of every P when C >= P), so
        the other nodes' results are skipped (their random draws are still made), and of
        each node only the part from its first position used on (a resumed epoch uses the
        rest of each node: py1e then orders only that part). The last partial shuffle is
        kept: the workers of one node share their canonical nodes.
        """
        if not self.shuffle:
            return None
        n, c = self.epoch_size, self.num_canonical_nodes
        bounds = n * np.arange(c + 1, dtype=np.int64) // c
        if "shuffle_ids" in self.__dict__:  # the whole shuffle is cached already
            return ShuffleParts(bounds, full=self.shuffle_ids)
        used = positions[positions >= 0]
        nodes = np.searchsorted(bounds, used, side="right") - 1
        keep: dict[int, int] = {}
        if used.size:
            # Per node, its first position used (relative to the node).
            firsts = np.full(c, n, np.int64)
            np.minimum.at(firsts, nodes, used)
            for node in sorted_unique(nodes).tolist():
                keep[node] = int(firsts[node] - bounds[node])
        cached = self._last_parts
        if cached is not None and all(k in cached[0] and cached[0][k] <= v for k, v in keep.items()):
            return cached[1]
        parts = shuffle_parts(self.shuffle_algo, self.resampled.units, c, self.shuffle_seed,
                              self.epoch, self.shuffle_block_size, keep, self.node_states)
        self.node_states.update(parts.node_states)
        self._last_parts = (keep, parts)
        return parts

    @cached_property
    def shuffle_key(self) -> str:
        """What identifies this epoch's shuffle (algorithm, units, canonical nodes, seed,
        epoch, block): the key under which :attr:`node_states` may be kept and given back."""
        digest = hashlib.sha256(np.ascontiguousarray(self.resampled.units, "<i8").tobytes())
        digest.update(repr((self.shuffle_algo, self.num_canonical_nodes, self.shuffle_seed, self.epoch,
                            self.shuffle_block_size)).encode())
        return digest.hexdigest()

    def rank_order(self, node: int, local_rank: int, *, drop_last: bool = False) -> Int64Array:
        """The sample ids a rank's loader returns, in order, padding dropped.

        The batches of :func:`astream._sampling.order.rank_batches`, concatenated.
        """
        order = rank_batches(self, node, local_rank, drop_last=drop_last)
        return np.concatenate(order) if order else np.zeros(0, np.int64)

    # --- resampling and the merged batching methods ---------------------------------------------

    def _resample(self, stream_ids: Sequence[int]) -> Resampled:
        return resample(
            [self.streams[i].shard_sizes for i in stream_ids],
            [self.stream_offsets[i] for i in stream_ids],
            [int(self.weights.choose[i]) for i in stream_ids],
            seed=self.shuffle_seed, epoch=self.epoch, granularity=self.sampling_granularity,
            balanced=self.sampling_method == "balanced", epoch_seed_change=self.epoch_seed_change,
        )

    @cached_property
    def _merged(self) -> Int64Array:
        """The epoch tensor of a merged batching method (computed in :mod:`.merged`)."""
        return merged_work(self)
