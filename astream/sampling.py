"""Sample order: shuffles, partitions, stream mixing and epoch plans (pure NumPy).

Same functions and parameters as MosaicML Streaming, bit-exact with its 0.13 release::

    from astream.sampling import get_shuffle, get_partitions, plan_epoch, EpochPlan

``plan_epoch`` returns the whole ``(nodes, ranks, workers, batches, batch_size)`` tensor;
``EpochPlan`` also gives one worker's sequence, the resolved defaults and ``len`` per rank.
``forecast_epoch`` plays a plan through the cache's eviction policy (what ``astream plan``
prints): bytes downloaded, evictions, peak cache, stall at a bandwidth, shuffle quality.
"""

from __future__ import annotations

from astream._sampling.defaults import (
    BATCHING_METHODS,
    PARTITION_ALGOS,
    SAMPLING_METHODS,
    SHUFFLE_ALGOS,
    resolve_num_canonical_nodes,
    resolve_predownload,
    resolve_shuffle_block_size,
)
from astream._sampling.forecast import EpochForecast, NodeForecast, forecast_epoch, shuffle_quality
from astream._sampling.options import PlanOptions
from astream._sampling.order import WorkerBatches, rank_batches, round_robin, worker_batches
from astream._sampling.partition import get_partitions
from astream._sampling.plan import EpochPlan
from astream._sampling.shuffle import get_shuffle
from astream._sampling.streams import StreamSpec, StreamWeights
from astream._sampling.warnings import SamplingWarning
from astream._sampling.work import plan_epoch

__all__ = [
    "BATCHING_METHODS",
    "PARTITION_ALGOS",
    "SAMPLING_METHODS",
    "SHUFFLE_ALGOS",
    "EpochForecast",
    "EpochPlan",
    "NodeForecast",
    "PlanOptions",
    "SamplingWarning",
    "StreamSpec",
    "StreamWeights",
    "WorkerBatches",
    "forecast_epoch",
    "get_partitions",
    "get_shuffle",
    "plan_epoch",
    "rank_batches",
    "resolve_num_canonical_nodes",
    "resolve_predownload",
    "resolve_shuffle_block_size",
    "round_robin",
    "shuffle_quality",
    "worker_batches",
]

for _name in __all__:
    _obj = globals()[_name]
    if hasattr(_obj, "__module__") and callable(_obj):
        _obj.__module__ = __name__
del _name, _obj
