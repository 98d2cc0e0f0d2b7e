"""Per-rank orders of real multi-process runs (orders/e2e.json) and resumptions (resume.json).

A rank's order follows from the work tensor as the fixtures' README describes; mixtures
record each sample's id inside its own stream.
"""

from __future__ import annotations

import numpy as np
import pytest

from astream.sampling import EpochPlan

from .golden import orders_json, plan_from_cfg


def _rank_orders(plan: EpochPlan) -> list[list[int]]:
    offsets = np.asarray(plan.stream_offsets)
    orders = []
    for rank in range(plan.num_ranks):
        ids = plan.rank_order(rank // plan.ranks_per_node, rank % plan.ranks_per_node)
        stream = np.searchsorted(offsets, ids, side="right") - 1
        orders.append((ids - offsets[stream]).tolist())
    return orders


def _cases(name: str) -> list[dict]:
    return orders_json(name)["cases"]  # type: ignore[no-any-return]


@pytest.mark.parametrize("case", _cases("e2e.json"), ids=lambda c: c["name"])
def test_e2e_rank_orders(case: dict) -> None:
    for epoch, recorded in case["epochs"].items():
        plan = plan_from_cfg(case["cfg"], epoch=int(epoch))
        orders = _rank_orders(plan)
        assert [len(o) for o in orders] == recorded["per_rank_len"], f"epoch {epoch}"
        assert orders == recorded["per_rank_order"], f"epoch {epoch}"
        assert plan.num_canonical_nodes == recorded["resolved"]["num_canonical_nodes"]
        assert plan.shuffle_block_size == recorded["resolved"]["shuffle_block_size"]


@pytest.mark.parametrize("case", _cases("resume.json"), ids=lambda c: c["name"])
def test_resumption(case: dict) -> None:
    first = case["first_run"]
    predicted = _rank_orders(plan_from_cfg(first["cfg"]))
    for rank, consumed in enumerate(first["consumed_per_rank"]):
        assert predicted[rank][: len(consumed)] == consumed, f"rank {rank}"
    state = first["state_dict"]
    assert state["sample_in_epoch"] == sum(len(c) for c in first["consumed_per_rank"])
    for run in case["resumed_runs"]:
        restored = {
            "epoch": state["epoch"],
            "sample_in_epoch": state["sample_in_epoch"],
            "num_canonical_nodes": state["num_canonical_nodes"],
            "shuffle_seed": state["shuffle_seed"],
            "initial_physical_nodes": state["initial_physical_nodes"],
        }
        resumed = plan_from_cfg(run["cfg"], **restored)
        assert _rank_orders(resumed) == run["per_rank_order_resumed_epoch"], run["cfg"]["world"]
        assert resumed.rank_len == run["len_reported_by_dataset"]
        following = plan_from_cfg(run["cfg"], **{**restored, "epoch": state["epoch"] + 1, "sample_in_epoch": 0})
        assert _rank_orders(following) == run["per_rank_order_next_epoch"], run["cfg"]["world"]
        # Nothing consumed before the checkpoint is lost: together they cover the epoch.
        seen = {i for c in first["consumed_per_rank"] for i in c}
        seen |= {i for o in run["per_rank_order_resumed_epoch"] for i in o}
        assert len(seen) == run["coverage_vs_uninterrupted_epoch"]["distinct_ids_seen"]


def test_shard_of_follows_the_layout() -> None:
    plan = EpochPlan([{"shard_sizes": [3, 0, 2]}, {"shard_sizes": [4]}], batch_size=2)
    ids = np.array([0, 2, 3, 4, 5, 8, -1])
    assert plan.shard_of(ids).tolist() == [0, 0, 2, 2, 3, 3, -1]
    assert plan.state_initial_physical_nodes == 1
    work = plan.work()
    assert set(plan.shard_of(work[work >= 0]).tolist()) == {0, 2, 3}
