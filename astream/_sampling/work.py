"""``plan_epoch``: MosaicML's ``generate_work`` as one function of keywords.

Apart from :mod:`astream._sampling.plan` so that the plan module holds the plan and its
queries only; this is the functional front MosaicML users call (``astream.sampling``).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from numpy.typing import NDArray

from astream._sampling import defaults
from astream._sampling.plan import EpochPlan
from astream._sampling.streams import StreamSpec
from astream.errors import ConfigError

__all__ = ["plan_epoch"]

Int64Array = NDArray[np.int64]


def plan_epoch(
    streams: Sequence[StreamSpec | Mapping[str, Any]],
    shuffle: bool = False,
    shuffle_algo: str = defaults.DEFAULT_SHUFFLE_ALGO,
    shuffle_seed: int = defaults.DEFAULT_SHUFFLE_SEED,
    num_canonical_nodes: int | None = None,
    shuffle_block_size: int | None = None,
    partition_algo: str = defaults.DEFAULT_PARTITION_ALGO,
    batch_size: int | None = None,
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
) -> Int64Array:
    """Return the epoch tensor MosaicML's ``generate_work`` builds for these settings.

    Parameters are :class:`EpochPlan`'s. The result is an int64 array of shape
    ``(nodes, ranks per node, workers per rank, batches per worker, batch_size)`` holding
    global sample ids (streams' samples concatenated in order), ``-1`` for padding.

    Raises:
        ConfigError: a parameter MosaicML would reject, or ``batch_size`` missing.
    """
    if batch_size is None:
        raise ConfigError("batch_size is required to plan an epoch (the per-device batch size)")
    return EpochPlan(
        streams, shuffle=shuffle, shuffle_algo=shuffle_algo, shuffle_seed=shuffle_seed,
        num_canonical_nodes=num_canonical_nodes, shuffle_block_size=shuffle_block_size,
        partition_algo=partition_algo, batch_size=batch_size, num_physical_nodes=num_physical_nodes,
        ranks_per_node=ranks_per_node, workers_per_rank=workers_per_rank, epoch=epoch,
        sample_in_epoch=sample_in_epoch, initial_physical_nodes=initial_physical_nodes,
        epoch_size=epoch_size, sampling_method=sampling_method,
        sampling_granularity=sampling_granularity, batching_method=batching_method,
    ).work()
