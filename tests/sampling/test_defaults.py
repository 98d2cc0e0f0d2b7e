"""MosaicML's defaults for canonical nodes, block size and predownload (manifest ``defaults``)."""

from __future__ import annotations

import pytest

from astream.errors import ConfigError
from astream.sampling import (
    EpochPlan,
    resolve_num_canonical_nodes,
    resolve_predownload,
    resolve_shuffle_block_size,
)

from .golden import manifest


def test_recorded_defaults() -> None:
    wrong = []
    for d in manifest()["defaults"]:
        ncn = resolve_num_canonical_nodes(d["given_num_canonical_nodes"], d["shuffle_algo"], d["num_physical_nodes"])
        block = resolve_shuffle_block_size(d["given_shuffle_block_size"], ncn)
        predownload = resolve_predownload(None, d["given_batch_size"])
        got = (ncn, block, predownload)
        want = (d["resolved_num_canonical_nodes"], d["resolved_shuffle_block_size"], d["resolved_predownload"])
        if got != want:
            wrong.append((d, got))
    assert not wrong, wrong[:5]


def test_plan_resolves_defaults() -> None:
    for d in manifest()["defaults"]:
        ncn, nodes = d["resolved_num_canonical_nodes"], d["num_physical_nodes"]
        if ncn % nodes and nodes % ncn:
            # MosaicML resolves these too but fails when partitioning; the plan fails early.
            with pytest.raises(ConfigError, match="num_canonical_nodes"):
                _plan(d)
            continue
        plan = _plan(d)
        assert (plan.num_canonical_nodes, plan.shuffle_block_size) == (
            d["resolved_num_canonical_nodes"], d["resolved_shuffle_block_size"]
        ), d


def _plan(d: dict) -> EpochPlan:
    return EpochPlan(
        [{"shard_sizes": [5000] * 4}],
        shuffle_algo=d["shuffle_algo"],
        num_canonical_nodes=d["given_num_canonical_nodes"],
        shuffle_block_size=d["given_shuffle_block_size"],
        batch_size=d["given_batch_size"] or 1,
        num_physical_nodes=d["num_physical_nodes"],
        ranks_per_node=d["ranks_per_node"],
    )


def test_zero_canonical_nodes_means_default() -> None:
    # MosaicML tests the value's truthiness, so 0 is "not given".
    assert resolve_num_canonical_nodes(0, "py1s", 2) == 128
    assert resolve_shuffle_block_size(None, None) == 1 << 18
