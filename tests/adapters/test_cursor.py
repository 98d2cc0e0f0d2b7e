"""Random access to an epoch's batches (what the Keras adapter serves), without any framework."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from adapterkit import BATCH, COLUMNS, make_loader, write_dataset

from astream.adapters._columns import ColumnKind, column_kind, select_columns
from astream.adapters._cursor import EpochCursor
from astream.errors import ConfigError


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_dataset(tmp_path_factory.mktemp("ds") / "ds")


def _ids(batches: list[dict[str, np.ndarray]]) -> list[list[int]]:
    return [[int(i) for i in b["id"]] for b in batches]


@pytest.mark.parametrize("workers", [0, 2])
def test_cursor_serves_the_loaders_batches_in_any_order(data: Path, tmp_path: Path, workers: int) -> None:
    loader = make_loader(data, tmp_path / "a", num_workers=workers, worker_mode="thread")
    expected = [_ids(list(loader)) for _ in range(2)]
    cursor = EpochCursor(make_loader(data, tmp_path / "b", num_workers=workers, worker_mode="thread"))
    for epoch in range(2):
        order = list(range(len(cursor)))[::-1]  # backwards: random access must not care
        got = {i: [int(x) for x in cursor.fetch(i)["id"]] for i in order}
        assert [got[i] for i in range(len(cursor))] == expected[epoch]
        cursor.advance()
    assert cursor.epoch == 2


def test_streaming_cursor_serves_in_order_and_random_requests_alike(data: Path, tmp_path: Path) -> None:
    loader = make_loader(data, tmp_path / "a")
    expected = [_ids(list(loader)) for _ in range(2)]
    assert expected[0] != expected[1]
    cursor = EpochCursor(make_loader(data, tmp_path / "b"), stream=True)
    # Keras' pattern: batch 0 (to build the model), then the epoch in order, twice.
    assert [int(i) for i in cursor.fetch(0)["id"]] == expected[0][0]
    for epoch in range(2):
        got = [[int(i) for i in cursor.fetch(k)["id"]] for k in range(len(cursor))]
        assert got == expected[epoch]
        # Out of order in the middle of a stream: random access, and the stream goes on.
        assert [int(i) for i in cursor.fetch(3)["id"]] == expected[epoch][3]
        cursor.advance()
    cursor.close_stream()


def test_cursor_state_resumes_a_loader_exactly(data: Path, tmp_path: Path) -> None:
    cursor = EpochCursor(make_loader(data, tmp_path / "a"))
    batches = [[int(i) for i in cursor.ids(k)] for k in range(len(cursor))]
    state = cursor.state_dict(5)
    assert state["epoch"] == 0
    assert state["sample_in_epoch"] == 5 * BATCH
    loader = make_loader(data, tmp_path / "b")
    loader.load_state_dict(state)
    assert _ids(list(loader)) == batches[5:]
    # A fresh cursor picks the loaded position up too.
    resumed = EpochCursor(make_loader(data, tmp_path / "c"))
    resumed.load_state_dict(state)
    assert [[int(i) for i in resumed.ids(k)] for k in range(len(resumed))] == batches[5:]


def test_cursor_state_at_the_end_of_an_epoch_is_the_next_epoch(data: Path, tmp_path: Path) -> None:
    cursor = EpochCursor(make_loader(data, tmp_path / "a"))
    state = cursor.state_dict(len(cursor))
    assert (state["epoch"], state["sample_in_epoch"]) == (1, 0)
    with pytest.raises(ConfigError):
        cursor.state_dict(len(cursor) + 1)
    with pytest.raises(IndexError):
        cursor.ids(len(cursor))


@pytest.mark.parametrize(
    ("encoding", "kind"),
    [
        ("ndarray:float32:3,32,32", ColumnKind("float32", (3, 32, 32))),
        ("ndarray:uint8", ColumnKind("uint8", None)),
        ("int64", ColumnKind("int64", ())),
        ("int", ColumnKind("int64", ())),
        ("str_float", ColumnKind("float64", ())),
        ("str", ColumnKind("string", ())),
        ("bytes", ColumnKind("string", ())),
        ("json", ColumnKind(None, None)),
        ("jpeg", ColumnKind(None, None)),
    ],
)
def test_column_kind(encoding: str, kind: ColumnKind) -> None:
    assert column_kind(encoding) == kind


def test_select_columns() -> None:
    batch = {"x": np.ones((2, 4)), "y": np.zeros(2), "s": ["a", "b"]}
    x, y = select_columns(COLUMNS, "x", "y", None, None)(batch)
    assert x.shape == (2, 4)
    assert y.shape == (2,)
    inputs, = select_columns(COLUMNS, ["x", "s"], None, None, None)(batch)
    assert set(inputs) == {"x", "s"}
    assert inputs["s"].tolist() == ["a", "b"]
    assert select_columns(COLUMNS, None, None, None, None)(batch) == batch
    with pytest.raises(ConfigError, match="'nope'"):
        select_columns(COLUMNS, "nope", None, None, None)
    with pytest.raises(ConfigError, match="not both"):
        select_columns(COLUMNS, "x", None, None, lambda b: b)
    with pytest.raises(ConfigError, match="need x"):
        select_columns(COLUMNS, None, "y", None, None)
