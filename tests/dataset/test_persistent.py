"""Persistent worker processes: started once, given each epoch's job, closed by close()."""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import pytest

from astream import Loader, MDSWriter, StreamingDataset
from tests.dataset.worker_jobs import tag_pid

N = 150


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("persistent") / "ds"
    with MDSWriter(root, {"id": "int64", "x": "ndarray:float32:8"}, size_limit=1500) as writer:
        for i in range(N):
            writer.write({"id": i, "x": np.full(8, i, np.float32)})
    return root


def _epoch(loader: Loader) -> tuple[list[list[int]], set[int]]:
    batches, pids = [], set()
    for batch in loader:
        batches.append(batch["id"].tolist())
        pids.update(batch["pid"].tolist())
    return batches, pids


def _gone(pid: int) -> bool:
    deadline = time.monotonic() + 10
    while time.monotonic() < deadline:
        try:
            with open(f"/proc/{pid}/stat") as f:
                if f.read().split(") ")[1][0] == "Z":
                    return True
        except FileNotFoundError:
            return True
        time.sleep(0.05)
    return False


@pytest.mark.parametrize("drop_last", [False, True])
def test_workers_persist_across_epochs_in_the_plans_order(data: Path, drop_last: bool) -> None:
    ds = StreamingDataset(local=str(data), batch_size=8, shuffle=True, shuffle_seed=3)
    try:
        with Loader(ds, num_workers=2, batch_transform=tag_pid, drop_last=drop_last) as loader:
            seen = []
            for epoch in range(3):
                want = [b.tolist() for b in loader.batch_ids(epoch)]
                batches, pids = _epoch(loader)
                assert batches == want, f"epoch {epoch}"
                seen.append(pids - {os.getpid()})  # the consumer's stand-ins may serve epoch 0's first batches
            # Later epochs come from the processes the first epoch started.
            assert len(seen[1]) == 2, seen
            assert seen[1] == seen[2], seen
        assert all(_gone(pid) for pid in seen[2]), "close() left worker processes running"
    finally:
        ds.close()


def test_resume_between_epochs_with_persistent_workers(data: Path) -> None:
    ds = StreamingDataset(local=str(data), batch_size=8, shuffle=True, shuffle_seed=5)
    try:
        with Loader(ds, num_workers=2, batch_transform=tag_pid, drop_last=True) as loader:
            _epoch(loader)  # epoch 0, whole: the workers are kept
            head = []
            for batch in loader:  # epoch 1, left after 3 batches
                head.append(batch["id"].tolist())
                if len(head) == 3:
                    break
            state = loader.state_dict()
            assert state["epoch"] == 1
            loader.load_state_dict(state)
            rest, _ = _epoch(loader)
            want = [b.tolist() for b in loader.batch_ids(1)]
            assert head + rest == want
            again, pids = _epoch(loader)  # epoch 2 from the start, workers kept from the resume
            assert again == [b.tolist() for b in loader.batch_ids(2)]
            third, pids3 = _epoch(loader)
            assert third == [b.tolist() for b in loader.batch_ids(3)]
            assert pids3 - {os.getpid()} == pids - {os.getpid()}
    finally:
        ds.close()


def test_without_persistent_workers_every_epoch_starts_new_ones(data: Path) -> None:
    ds = StreamingDataset(local=str(data), batch_size=8)
    try:
        with Loader(ds, num_workers=2, batch_transform=tag_pid, persistent_workers=False) as loader:
            first = _epoch(loader)[1] - {os.getpid()}
            second = _epoch(loader)[1] - {os.getpid()}
            assert not first & second
    finally:
        ds.close()
