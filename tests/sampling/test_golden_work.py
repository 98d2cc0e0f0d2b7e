"""Every recorded epoch tensor (orders/work.npz) is reproduced, whole and worker by worker."""

from __future__ import annotations

import math
from collections import defaultdict

import numpy as np
import pytest

from astream.errors import ConfigError

from .golden import manifest, orders_npz, plan_from_cfg


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
