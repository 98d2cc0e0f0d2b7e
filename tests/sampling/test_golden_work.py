"""Every recorded epoch tensor (orders/work.npz) is reproduced, whole and worker by worker."""

from __future__ import annotations

import math
from collections import defaultdict

import numpy as np
import pytest

from astream.errors import ConfigError
from astream.sampling import plan_epoch

from .golden import manifest, orders_npz, plan_from_cfg, shard_sizes


def _group(c: dict) -> str:
    if "batching_method" in c:
        return c["batching_method"]
    if len(c["streams"]) > 1:
        return f"mixture-{c.get('weighting', 'none')}"
    return c["shuffle_algo"] if c["shuffle"] else "no-shuffle"


def _groups() -> dict[str, list[dict]]:
    groups: dict[str, list[dict]] = defaultdict(list)
    for c in manifest()["work"]["configs"]:
        if c["key"] is not None:
            groups[_group(c)].append(c)
    return groups


@pytest.mark.parametrize("group", sorted(_groups()))
def test_golden_work(group: str) -> None:
    expected = orders_npz("work.npz")
    configs = _groups()[group]
    mismatches = []
    for c in configs:
        plan = plan_from_cfg(c)
        got = plan.work()
        want = expected[c["key"]]
        r = c["resolved"]
        resolved = (plan.num_canonical_nodes, plan.shuffle_block_size, plan.epoch_size, plan.num_samples)
        if resolved != (r["num_canonical_nodes"], r["shuffle_block_size"], r["epoch_size"], r["num_samples"]):
            mismatches.append((c["id"], "resolved", resolved))
        elif got.dtype != np.int64 or got.shape != tuple(c["shape"]) or not np.array_equal(got, want):
            mismatches.append((c["id"], "work"))
        elif plan.shape != got.shape:
            mismatches.append((c["id"], "shape"))
        elif plan.rank_len != math.ceil(r["epoch_size"] / plan.num_ranks):
            mismatches.append((c["id"], "len"))
    assert not mismatches, f"{len(mismatches)}/{len(configs)} of {group} differ: {mismatches[:20]}"


def test_golden_work_per_worker() -> None:
    """``worker_ids`` (computed without the whole tensor) is the tensor's slice, for every config."""
    expected = orders_npz("work.npz")
    mismatches = []
    for c in manifest()["work"]["configs"]:
        if c["key"] is None:
            continue
        plan = plan_from_cfg(c)
        want = expected[c["key"]]
        mismatches += [
            (c["id"], *index)
            for index in np.ndindex(*want.shape[:3])
            if not np.array_equal(plan.worker_ids(*index), want[index].reshape(-1))
        ]
    assert not mismatches, mismatches[:20]


def test_golden_work_errors() -> None:
    configs = [c for c in manifest()["work"]["configs"] if c["key"] is None]
    assert configs
    wrong = []
    for c in configs:
        with pytest.raises(ConfigError) as info:
            plan_from_cfg(c).work()
        message = str(info.value)
        if "divisible" in c["error"]:
            ok = "num_canonical_nodes" in message and "num_physical_nodes" in message
        elif "Resuming further" in c["error"]:
            ok = "sample_in_epoch" in message
        else:
            ok = True
        if not ok:
            wrong.append((c["id"], message))
    assert not wrong, wrong


def test_plan_epoch_function() -> None:
    """The pure public function gives the same tensors (keyword names as in the issue)."""
    expected = orders_npz("work.npz")
    mismatches = []
    for c in manifest()["work"]["configs"]:
        if c["key"] is None:
            continue
        streams = [
            {"shard_sizes": shard_sizes(s["layout"]), "proportion": s.get("proportion"),
             "repeat": s.get("repeat"), "choose": s.get("choose")}
            for s in c["streams"]
        ]
        work = plan_epoch(
            streams=streams, shuffle=c["shuffle"], shuffle_algo=c["shuffle_algo"],
            shuffle_seed=c["shuffle_seed"], num_canonical_nodes=c["num_canonical_nodes"],
            shuffle_block_size=c["shuffle_block_size"], partition_algo=c["partition_algo"],
            batch_size=c["batch_size"], num_physical_nodes=c["world"]["num_physical_nodes"],
            ranks_per_node=c["world"]["ranks_per_node"], workers_per_rank=c["world"]["workers_per_rank"],
            epoch=c["epoch"], sample_in_epoch=c["sample_in_epoch"],
            initial_physical_nodes=c["initial_physical_nodes"], epoch_size=c.get("epoch_size"),
            sampling_method=c.get("sampling_method", "balanced"),
            sampling_granularity=c.get("sampling_granularity", 1),
            batching_method=c.get("batching_method", "random"),
        )
        if work.dtype != np.int64 or not np.array_equal(work, expected[c["key"]]):
            mismatches.append(c["id"])
    assert not mismatches, mismatches[:20]
