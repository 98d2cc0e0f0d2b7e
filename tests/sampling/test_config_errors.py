"""Configurations that cannot work raise ConfigError naming the parameter and what is allowed."""

from __future__ import annotations

from typing import Any

import pytest

from astream.errors import ConfigError
from astream.sampling import EpochPlan, get_partitions, get_shuffle, plan_epoch

STREAM = {"shard_sizes": [10, 20, 30]}


def _plan(streams: list[dict[str, Any]] | None = None, **kw: Any) -> EpochPlan:
    kw.setdefault("batch_size", 4)
    return EpochPlan(streams or [STREAM], **kw)


@pytest.mark.parametrize(
    ("kw", "words"),
    [
        ({"shuffle_algo": "py3z"}, ["shuffle_algo", "'py1e'", "'py1b'", "'naive'"]),
        ({"partition_algo": "fancy"}, ["partition_algo", "'orig'", "'relaxed'"]),
        ({"sampling_method": "even"}, ["sampling_method", "'balanced'", "'fixed'"]),
        ({"batching_method": "mixed"}, ["batching_method", "'random'", "'device_per_stream'"]),
        ({"batch_size": 0}, ["batch_size", ">= 1"]),
        ({"batch_size": -3}, ["batch_size"]),
        ({"batch_size": 2.5}, ["batch_size", "integer"]),
        ({"shuffle_seed": -1}, ["shuffle_seed", ">= 0"]),
        ({"epoch": -1}, ["epoch"]),
        ({"sample_in_epoch": -5}, ["sample_in_epoch"]),
        ({"num_physical_nodes": 0}, ["num_physical_nodes"]),
        ({"ranks_per_node": 0}, ["ranks_per_node"]),
        ({"workers_per_rank": 0}, ["workers_per_rank"]),
        ({"sampling_granularity": 0}, ["sampling_granularity"]),
        ({"shuffle_block_size": 0}, ["shuffle_block_size"]),
        ({"num_canonical_nodes": -2}, ["num_canonical_nodes"]),
        ({"num_canonical_nodes": 3, "num_physical_nodes": 2}, ["num_canonical_nodes=3", "num_physical_nodes=2"]),
        ({"num_canonical_nodes": 4, "num_physical_nodes": 6, "partition_algo": "orig"}, ["num_canonical_nodes"]),
        ({"epoch_size": "12 parsecs"}, ["epoch_size"]),
        ({"sample_in_epoch": 100}, ["sample_in_epoch"]),
        ({"shuffle": True, "shuffle_algo": "py1br", "shuffle_block_size": 1}, ["shuffle_block_size", "py1br"]),
    ],
)
def test_bad_plan_parameters(kw: dict[str, Any], words: list[str]) -> None:
    with pytest.raises(ConfigError) as info:
        _plan(**kw).work()
    for word in words:
        assert word in str(info.value)


@pytest.mark.parametrize(
    ("streams", "kw", "words"),
    [
        ([{"shard_sizes": [5], "proportion": 0.5}, {"shard_sizes": [5], "repeat": 2}], {}, ["proportion", "repeat"]),
        ([{"shard_sizes": [5], "repeat": 1}, {"shard_sizes": [5], "proportion": 0.5}], {}, ["proportion"]),
        ([{"shard_sizes": [5], "proportion": 0.5, "choose": 3}], {}, ["proportion", "choose"]),
        ([{"shard_sizes": [5], "repeat": -1}], {}, ["repeat"]),
        ([{"shard_sizes": [5], "repeat": 2}], {"epoch_size": 100}, ["epoch_size"]),
        ([{"shard_sizes": [0, 0]}], {}, ["stream 0", "no samples"]),
        ([{"shard_sizes": [-1, 5]}], {}, ["shard_sizes"]),
        ([{"shards": [5]}], {}, ["shard_sizes"]),
        ([], {}, ["streams"]),
        ([{"shard_sizes": [5], "proportion": 0}, {"shard_sizes": [5], "proportion": 0}], {}, ["proportion"]),
        ([{"shard_sizes": [5], "choose": 0}], {}, ["no sample"]),
    ],
)
def test_bad_streams(streams: list[dict[str, Any]], kw: dict[str, Any], words: list[str]) -> None:
    with pytest.raises(ConfigError) as info:
        EpochPlan(streams, batch_size=2, **kw)
    for word in words:
        assert word in str(info.value)


def test_errors_come_before_any_work() -> None:
    """A bad world is reported by the constructor, not when the epoch is computed."""
    with pytest.raises(ConfigError, match="num_canonical_nodes"):
        EpochPlan([STREAM], batch_size=1, num_canonical_nodes=3, num_physical_nodes=2)


def test_plan_epoch_needs_a_batch_size() -> None:
    with pytest.raises(ConfigError, match="batch_size"):
        plan_epoch([STREAM])


def test_worker_outside_the_world() -> None:
    plan = _plan(num_physical_nodes=2, ranks_per_node=2, num_canonical_nodes=2)
    with pytest.raises(ConfigError, match="local_rank"):
        plan.worker_ids(0, 2, 0)
    with pytest.raises(ConfigError, match="node"):
        plan.worker_ids(-1, 0, 0)


def test_function_level_errors() -> None:
    with pytest.raises(ConfigError, match="shuffle_algo"):
        get_shuffle("py1q", [3, 4], 1, 0, 0)
    with pytest.raises(ConfigError, match="num_canonical_nodes"):
        get_shuffle("py1e", [3], 8, 0, 0)  # a canonical node without samples
    with pytest.raises(ConfigError, match="partition_algo"):
        get_partitions("best", 10, 1, 1, 1, 1, 1)
    with pytest.raises(ConfigError, match="initial device count"):
        get_partitions("relaxed", 100, 4, 3, 2, 1, 1, 0, 2)
    with pytest.raises(ConfigError, match="batch_size"):
        get_partitions("orig", 10, 1, 1, 1, 1, 0)


def test_batching_method_errors() -> None:
    streams = [{"shard_sizes": [50], "proportion": 0.99}, {"shard_sizes": [50], "proportion": 0.01}]
    with pytest.raises(ConfigError, match="stream 1"):
        EpochPlan(streams, batch_size=2, batching_method="stratified").work()
    with pytest.raises(ConfigError, match="device_per_stream"):
        EpochPlan(streams, batch_size=2, num_canonical_nodes=2, num_physical_nodes=4,
                  batching_method="device_per_stream").work()
    with pytest.raises(ConfigError, match="per_stream"):
        EpochPlan([{"shard_sizes": [3]}, {"shard_sizes": [100]}], batch_size=8,
                  batching_method="per_stream").work()
