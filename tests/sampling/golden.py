"""Access to the golden orders recorded from mosaicml-streaming 0.13 (tests/fixtures/orders)."""

from __future__ import annotations

import json
from functools import cache
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from astream.sampling import EpochPlan

ORDERS = Path(__file__).resolve().parents[1] / "fixtures" / "orders"


@cache
def _load_json(name: str) -> Any:
    path = ORDERS / name
    if not path.is_file():
        pytest.fail(f"golden orders not found at {path}; see tests/fixtures/README.md")
    return json.loads(path.read_text())


@cache
def _load_npz(name: str) -> dict[str, np.ndarray]:
    with np.load(ORDERS / name) as z:
        return {k: z[k] for k in z.files}


def manifest() -> dict[str, Any]:
    """``orders/manifest.json``."""
    return _load_json("manifest.json")  # type: ignore[no-any-return]


def orders_json(name: str) -> Any:
    """Any JSON file of ``orders/``."""
    return _load_json(name)


def orders_npz(name: str) -> dict[str, np.ndarray]:
    """All arrays of an ``orders/*.npz`` file."""
    return _load_npz(name)


def shard_sizes(layout: str) -> list[int]:
    """Shard sizes of a named layout."""
    return manifest()["layouts"][layout]["shard_sizes"]  # type: ignore[no-any-return]


def plan_from_cfg(cfg: dict[str, Any], **override: Any) -> EpochPlan:
    """An EpochPlan for a ``work``/``e2e``/``resume`` configuration of the fixtures."""
    streams = []
    for s in cfg["streams"]:
        stream: dict[str, Any] = {"shard_sizes": shard_sizes(s["layout"])}
        for key in ("proportion", "repeat", "choose"):
            if key in s:
                stream[key] = s[key]
        streams.append(stream)
    world = cfg["world"]
    kw: dict[str, Any] = {
        "shuffle": cfg["shuffle"],
        "shuffle_algo": cfg["shuffle_algo"],
        "shuffle_seed": cfg["shuffle_seed"],
        "num_canonical_nodes": cfg["num_canonical_nodes"],
        "shuffle_block_size": cfg["shuffle_block_size"],
        "partition_algo": cfg["partition_algo"],
        "batch_size": cfg["batch_size"],
        "num_physical_nodes": world["num_physical_nodes"],
        "ranks_per_node": world["ranks_per_node"],
        "workers_per_rank": world["workers_per_rank"],
        "epoch": cfg["epoch"],
        "sample_in_epoch": cfg["sample_in_epoch"],
        "initial_physical_nodes": cfg["initial_physical_nodes"],
    }
    for key in ("epoch_size", "sampling_method", "sampling_granularity", "batching_method"):
        if key in cfg:
            kw[key] = cfg[key]
    kw.update(override)
    return EpochPlan(streams, **kw)
