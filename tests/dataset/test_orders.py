"""The dataset yields exactly what mosaicml-streaming 0.13 yielded (recorded runs)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
from helpers import close_all, iterate_ranks, make_rank_datasets

from astream._dataset.loader import Loader


def _cases(fixtures: Path, name: str) -> list[dict[str, Any]]:
    return json.loads((fixtures / "orders" / name).read_text())["cases"]


def _kwargs(cfg: dict[str, Any]) -> dict[str, Any]:
    keys = ("shuffle", "shuffle_algo", "shuffle_seed", "num_canonical_nodes", "shuffle_block_size",
            "partition_algo", "batch_size", "epoch_size", "sampling_method", "sampling_granularity",
            "batching_method", "replication")
    return {k: cfg[k] for k in keys if k in cfg}


ORDERS = Path(__file__).resolve().parents[1] / "fixtures" / "orders"
E2E = [c["name"] for c in json.loads((ORDERS / "e2e.json")
                                      .read_text())["cases"]]


@pytest.mark.parametrize("name", E2E)
async def test_recorded_orders_two_epochs(fixtures_dir: Path, tmp_path: Path, name: str) -> None:
    case = next(c for c in _cases(fixtures_dir, "e2e.json") if c["name"] == name)
    cfg = case["cfg"]
    datasets = make_rank_datasets(cfg["streams"], fixtures_dir / "mds" / "layouts", tmp_path, cfg["world"],
                                  run_id=name, **_kwargs(cfg))
    try:
        for epoch in sorted(case["epochs"], key=int):
            expected = case["epochs"][epoch]
            if case["num_workers"]:
                got = await iterate_ranks(datasets, num_workers=case["num_workers"], batch_size=cfg["batch_size"])
            else:
                got = await iterate_ranks(datasets)
            assert [len(ds) for ds in datasets] == [
                -(-expected["resolved"]["epoch_size"] // len(datasets))
            ] * len(datasets)
            for rank, (mine, theirs) in enumerate(zip(got, expected["per_rank_order"], strict=True)):
                assert mine == theirs, f"{name}: epoch {epoch}, rank {rank} differs from mosaicml-streaming"
    finally:
        await close_all(datasets)


RESUME = [
    (c["name"], i)
    for c in json.loads((ORDERS / "resume.json").read_text())["cases"]
    for i in range(len(c["resumed_runs"]))
]


@pytest.mark.parametrize(("name", "run"), RESUME)
async def test_recorded_resumption(fixtures_dir: Path, tmp_path: Path, name: str, run: int) -> None:
    case = next(c for c in _cases(fixtures_dir, "resume.json") if c["name"] == name)
    first = case["first_run"]
    cfg = first["cfg"]
    layouts = fixtures_dir / "mds" / "layouts"
    # The first run: each rank consumes some batches through a loader, then saves its state.
    datasets = make_rank_datasets(cfg["streams"], layouts, tmp_path / "a", cfg["world"], run_id=f"{name}-a",
                                  **_kwargs(cfg))
    loaders = [Loader(ds, batch_size=cfg["batch_size"]) for ds in datasets]
    take = len(first["consumed_per_rank"][0]) // cfg["batch_size"]
    consumed = await iterate_ranks(datasets, num_workers=0, take_batches=take, loaders=loaders)
    assert consumed == first["consumed_per_rank"]
    states = [loader.state_dict() for loader in loaders]
    for state in states:
        assert {k: v for k, v in state.items() if not k.startswith("astream_")} == first["state_dict"]
    await close_all(datasets)

    resumed = case["resumed_runs"][run]
    rcfg = resumed["cfg"]
    datasets = make_rank_datasets(rcfg["streams"], layouts, tmp_path / "b", rcfg["world"], run_id=f"{name}-b{run}",
                                  **_kwargs(rcfg))
    try:
        for ds in datasets:
            ds.load_state_dict(first["state_dict"])  # as mosaicml-streaming saved it: no fingerprint
        assert [len(ds) for ds in datasets] == [resumed["len_reported_by_dataset"]] * len(datasets)
        got = await iterate_ranks(datasets)
        assert got == resumed["per_rank_order_resumed_epoch"]
        got = await iterate_ranks(datasets)
        assert got == resumed["per_rank_order_next_epoch"]
    finally:
        await close_all(datasets)


REPLICATION = [c["name"] for c in json.loads((ORDERS / "replication.json").read_text())["cases"]]


@pytest.mark.parametrize("name", REPLICATION)
async def test_recorded_replication_orders(fixtures_dir: Path, tmp_path: Path, name: str) -> None:
    """``replication``: every rank yields what the peer's rank yielded (replicas the same), epoch
    after epoch, and a loader's state after a few batches of the next epoch is the peer's."""
    case = next(c for c in _cases(fixtures_dir, "replication.json") if c["name"] == name)
    cfg = case["cfg"]
    datasets = make_rank_datasets(cfg["streams"], fixtures_dir / "mds" / "layouts", tmp_path, cfg["world"],
                                  run_id=name, **_kwargs(cfg))
    workers = case["num_workers"] or None
    try:
        for epoch in sorted(case["epochs"], key=int):
            expected = case["epochs"][epoch]
            got = await iterate_ranks(datasets, num_workers=workers, batch_size=cfg["batch_size"])
            assert [len(ds) for ds in datasets] == expected["per_rank_len"]
            for rank, (mine, theirs) in enumerate(zip(got, expected["per_rank_order"], strict=True)):
                assert mine == theirs, f"{name}: epoch {epoch}, rank {rank} differs from mosaicml-streaming"
        if case.get("take_batches"):
            loaders = [Loader(ds, batch_size=cfg["batch_size"], num_workers=case["num_workers"], worker_mode="thread")
                       for ds in datasets]
            taken = await iterate_ranks(datasets, num_workers=case["num_workers"], take_batches=case["take_batches"],
                                        loaders=loaders)
            assert taken == case["taken_per_rank"]
            for loader in loaders:
                state = loader.state_dict()
                assert {k: v for k, v in state.items() if not k.startswith("astream_")} == case["state_dict"]
    finally:
        await close_all(datasets)
    if case.get("take_batches"):
        # A restarted job loads the peer's state (no fingerprint) and yields the rest as it did.
        datasets = make_rank_datasets(cfg["streams"], fixtures_dir / "mds" / "layouts", tmp_path / "resumed",
                                      cfg["world"], run_id=f"{name}-resumed", **_kwargs(cfg))
        try:
            for ds in datasets:
                ds.load_state_dict(case["state_dict"])
            assert await iterate_ranks(datasets, num_workers=workers, batch_size=cfg["batch_size"]) == \
                case["resumed_per_rank"]
        finally:
            await close_all(datasets)
