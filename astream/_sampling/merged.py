"""The epoch tensor of the batching methods that merge per-stream work.

Split from :mod:`astream._sampling.plan` because these methods (``per_stream``,
``stratified``, ``device_per_stream``) compute the epoch another way than ``random``: each
stream alone is resampled, partitioned, shuffled and mapped, then :mod:`.batching` merges
the streams' tensors (O(epoch), as MosaicML does). :class:`~.plan.EpochPlan` caches the
result; this module only computes it from the plan's resolved values.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

import numpy as np
from numpy.typing import NDArray

from astream._sampling.batching import (
    MergeContext,
    merge_device_per_stream,
    merge_per_stream,
    merge_stratified,
)
from astream._sampling.partition import make_partition
from astream._sampling.shuffle import get_shuffle
from astream._sampling.streams import map_ids
from astream.errors import ConfigError

if TYPE_CHECKING:
    from astream._sampling.plan import EpochPlan

__all__ = ["merged_work", "stream_work"]

Int64Array = NDArray[np.int64]


def stream_work(plan: EpochPlan, stream: int, nodes: int, batch: int) -> Int64Array:
    """One stream alone: resampled, partitioned with ``drop_first=0``, shuffled, mapped."""
    resampled = plan._resample([stream])  # (the plan's resampling, for one stream)
    partition = make_partition(
        plan.partition_algo, resampled.size, plan.num_canonical_nodes, nodes,
        plan.ranks_per_node, plan.workers_per_rank, batch, 0, plan.initial_physical_nodes,
    )
    positions = partition.array()
    if plan.shuffle:
        # The block scales with the stream's share so the overall block stays as set.
        block = int(plan.shuffle_block_size * float(plan.weights.proportion[stream]))
        if block == 0 and plan.batching_method == "device_per_stream":
            raise ConfigError(
                f"stream {stream}'s shuffle block (shuffle_block_size={plan.shuffle_block_size} x "
                f"proportion {float(plan.weights.proportion[stream]):.6g}) is 0; raise one of them"
            )
        shuffle = get_shuffle(plan.shuffle_algo, resampled.units, plan.num_canonical_nodes,
                              plan.shuffle_seed, plan.epoch, block)
        map_ids(shuffle, positions)
    return resampled.to_small(positions)


def merged_work(plan: EpochPlan) -> Int64Array:
    """The whole epoch tensor of ``plan``'s merged ``batching_method``."""
    ctx = MergeContext(
        num_streams=len(plan.streams),
        proportions=[float(p) for p in plan.weights.proportion],
        nodes=plan.num_physical_nodes, ranks=plan.ranks_per_node, workers=plan.workers_per_rank,
        batch=plan.batch_size, num_canonical_nodes=plan.num_canonical_nodes,
        sample_in_epoch=plan.sample_in_epoch,
        label_seed=plan.shuffle_seed + plan.epoch if plan.epoch_seed_change else plan.shuffle_seed,
    )
    merge = {
        "per_stream": merge_per_stream,
        "stratified": merge_stratified,
        "device_per_stream": merge_device_per_stream,
    }[plan.batching_method]
    return merge(lambda stream, nodes, batch: stream_work(plan, stream, nodes, batch), ctx)
