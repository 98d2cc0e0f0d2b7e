"""num_workers="auto": the rule on its own, and a loader that applies it after its first epoch."""

from __future__ import annotations

import os
import time
from pathlib import Path

import numpy as np
import pytest

from astream import Loader, MDSWriter, StreamingDataset
from astream._dataset.workers import autowatch
from astream._dataset.workers.autoworkers import MAX_AUTO_WORKERS, choose_workers, usable_cores
from astream.errors import ConfigError
from tests.dataset.worker_jobs import busy_tag_pid, tag_pid

N = 96


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("auto") / "ds"
    with MDSWriter(root, {"id": "int64", "x": "ndarray:float32:8"}, size_limit=1500) as writer:
        for i in range(N):
            writer.write({"id": i, "x": np.full(8, i, np.float32)})
    return root


def test_usable_cores_is_the_affinity_mask() -> None:
    assert usable_cores() == len(os.sched_getaffinity(0))


def test_one_core_per_rank_takes_no_workers() -> None:
    assert choose_workers(1, 1, 0.1, 0.0, 0).workers == 0
    choice = choose_workers(8, 8, 0.1, 0.0, 0)  # 8 ranks share 8 cores
    assert choice.workers == 0
    assert "1 core per rank" in choice.reason


def test_a_batch_cheaper_than_its_crossing_takes_no_workers() -> None:
    choice = choose_workers(16, 1, 100e-6, 0.0, 32 * 1024)
    assert choice.workers == 0
    assert "less than" in choice.reason
    # The same cost for a batch of 1,000 x 100 KB: carrying it costs more still.
    assert choose_workers(16, 1, 1e-3, 0.0, 100_000_000).workers == 0


def test_enough_workers_to_keep_up_within_the_cores() -> None:
    assert choose_workers(16, 1, 10e-3, 2.5e-3, 0).workers == 4  # ceil(10 / 2.5)
    assert choose_workers(16, 1, 10e-3, 3e-3, 0).workers == 4  # ceil(3.33)
    assert choose_workers(4, 1, 10e-3, 1e-3, 0).workers == 3  # one core stays the consumer's
    assert choose_workers(64, 1, 1.0, 0.0, 0).workers == MAX_AUTO_WORKERS
    assert choose_workers(16, 4, 10e-3, 1e-3, 0).workers == 3  # 4 cores for each of 4 ranks
    assert choose_workers(16, 1, 2e-3, 10e-3, 0).workers == 1  # a slow consumer: one is enough


def test_auto_reads_the_first_epoch_itself_then_runs_the_choice(
    data: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(autowatch, "usable_cores", lambda: 4)  # a 4-core machine, whatever this one is
    ds = StreamingDataset(local=str(data), batch_size=8)
    try:
        with Loader(ds, num_workers="auto", batch_transform=busy_tag_pid) as loader:
            assert loader.num_workers == 0
            assert loader.worker_choice is None
            first = list(loader)
            assert {int(p) for b in first for p in b["pid"]} == {os.getpid()}
            assert loader.worker_choice is None  # chosen when the next epoch begins
            second = list(loader)
            choice = loader.worker_choice
            assert choice is not None
            assert choice.cores == 4
            assert choice.produce_s >= 0.003
            assert 1 <= choice.workers <= 3, choice
            assert loader.num_workers == choice.workers
            assert sorted(int(i) for b in second for i in b["id"]) == list(range(N))
            assert len(loader) == len(second)
            # (The consumer may serve that epoch's batches itself while the workers start.)
            third = list(loader)
            pids = {int(p) for b in third for p in b["pid"]}
            assert os.getpid() not in pids  # made in the persistent workers
            assert len(pids) == choice.workers
            assert loader.worker_choice is choice  # chosen once
    finally:
        ds.close()


def test_auto_with_a_transform_workers_cannot_get_stays_in_process(
    data: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    monkeypatch.setattr(autowatch, "usable_cores", lambda: 4)
    ds = StreamingDataset(local=str(data), batch_size=8)
    try:
        with Loader(ds, num_workers="auto", batch_transform=lambda b: tag_pid(busy_tag_pid(b))) as loader:
            for _ in range(2):
                assert sorted(int(i) for b in loader for i in b["id"]) == list(range(N))
            choice = loader.worker_choice
            assert choice is not None
            assert choice.workers == 0
            assert "cannot be pickled" in choice.reason
    finally:
        ds.close()


def test_num_workers_rejects_other_strings(data: Path) -> None:
    ds = StreamingDataset(local=str(data), batch_size=8)
    with pytest.raises(ConfigError, match="'auto'"):
        Loader(ds, num_workers="many")


def test_batches_read_ahead_before_the_consumer_takes_them_still_count(
    data: Path, monkeypatch: pytest.MonkeyPatch,
) -> None:
    # A consumer that stalls after its first batch (a loaded machine, a slow first step) lets
    # the read-ahead make the rest of the small epoch at once: their cost is counted all the same.
    monkeypatch.setattr(autowatch, "usable_cores", lambda: 4)
    ds = StreamingDataset(local=str(data), batch_size=8)
    try:
        with Loader(ds, num_workers="auto", batch_transform=busy_tag_pid) as loader:
            it = iter(loader)
            next(it)
            time.sleep(0.5)
            rest = list(it)
            assert len(rest) == N // 8 - 1
            list(loader)  # the choice is made as this epoch begins
            choice = loader.worker_choice
            assert choice is not None
            assert choice.produce_s >= 0.003, choice
    finally:
        ds.close()
