"""Run MosaicML Streaming's own functions on arbitrary inputs, for the ``peer`` tests.

Only imported by tests marked ``peer`` (after ``pytest.importorskip("streaming")``). It
builds the small duck-typed objects MosaicML's ``generate_work`` reads from a dataset, so
no shard files and no processes are needed.
"""

from __future__ import annotations

import sys
import types
from typing import Any

import numpy as np


def import_streaming() -> Any:
    """Import ``streaming`` with the vision extras stubbed out (they need torchvision)."""
    stub = types.ModuleType("streaming.vision")
    stub.__path__ = []  # type: ignore[attr-defined]
    sys.modules.setdefault("streaming.vision", stub)
    import streaming

    return streaming


class _Obj:
    pass


def peer_work(
    streams: list[dict[str, Any]],
    *,
    shuffle: bool,
    shuffle_algo: str,
    shuffle_seed: int,
    num_canonical_nodes: int,
    shuffle_block_size: int,
    partition_algo: str,
    batch_size: int,
    num_physical_nodes: int,
    ranks_per_node: int,
    workers_per_rank: int,
    epoch: int,
    sample_in_epoch: int,
    initial_physical_nodes: int | None,
    epoch_size: int | None,
    sampling_method: str,
    sampling_granularity: int,
    batching_method: str,
) -> np.ndarray:
    """MosaicML's ``generate_work`` on a stand-in dataset (defaults already resolved)."""
    import_streaming()
    from streaming.base.batching import generate_work
    from streaming.base.dataset import StreamingDataset
    from streaming.base.stream import Stream

    objs = []
    for s in streams:
        o = _Obj()
        for key in ("proportion", "repeat", "choose"):
            if s.get(key) is not None:
                setattr(o, key, s[key])
        objs.append(o)
    sizes = [np.asarray(s["shard_sizes"], np.int64) for s in streams]
    samples_per_stream = np.array([int(x.sum()) for x in sizes], np.int64)
    ds = _Obj()
    ds.epoch_size = Stream.apply_weights(objs, samples_per_stream, epoch_size, shuffle_seed)  # type: ignore[arg-type]
    ds.streams = objs
    ds.num_streams = len(streams)
    ds.shuffle = shuffle
    ds.shuffle_algo = shuffle_algo
    ds.shuffle_seed = shuffle_seed
    ds.num_canonical_nodes = num_canonical_nodes
    ds.shuffle_block_size = shuffle_block_size
    ds.partition_algo = partition_algo
    ds.batch_size = batch_size
    ds.initial_physical_nodes = initial_physical_nodes
    ds.sampling_method = sampling_method
    ds.sampling_granularity = sampling_granularity
    ds.epoch_seed_change = shuffle and sampling_method == "balanced"
    ds.shards_per_stream = np.array([len(x) for x in sizes], np.int64)
    ds.shard_offset_per_stream = np.concatenate([[0], np.cumsum(ds.shards_per_stream)[:-1]]).astype(np.int64)
    ds.samples_per_shard = np.concatenate(sizes)
    ds.sample_offset_per_shard = np.cumsum(ds.samples_per_shard) - ds.samples_per_shard
    ds.resample_streams = lambda e, stream_id=None: StreamingDataset.resample_streams(ds, e, stream_id)  # type: ignore[arg-type]
    world = _Obj()
    world.num_nodes = num_physical_nodes
    world.ranks_per_node = ranks_per_node
    world.workers_per_rank = workers_per_rank
    return np.asarray(generate_work(batching_method, ds, world, epoch, sample_in_epoch))  # type: ignore[arg-type]
