"""The optional torch adapter (skipped without torch, which astream never depends on)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from adapterkit import BATCH, make_loader, write_dataset

from astream.errors import UsageError

torch = pytest.importorskip("torch")

from astream.adapters.torch import StreamingIterableDataset  # noqa: E402  (after the skip)


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_dataset(tmp_path_factory.mktemp("ds") / "ds")


def test_dataloader_yields_the_loaders_batches_as_tensors(data: Path, tmp_path: Path) -> None:
    expected = list(make_loader(data, tmp_path / "a"))
    ds = StreamingIterableDataset(make_loader(data, tmp_path / "b"))
    got = list(torch.utils.data.DataLoader(ds, batch_size=None))
    assert len(got) == len(ds) == len(expected)
    for batch, want in zip(got, expected, strict=True):
        assert isinstance(batch["x"], torch.Tensor)
        assert batch["x"].dtype == torch.float32
        assert batch["x"].shape == (len(want["id"]), 4)
        np.testing.assert_array_equal(batch["id"].numpy(), want["id"])
        assert batch["s"] == want["s"]  # text stays a list of str


def test_state_round_trip_resumes_mid_epoch(data: Path, tmp_path: Path) -> None:
    everything = [b["id"].tolist() for b in StreamingIterableDataset(make_loader(data, tmp_path / "a"))]
    ds = StreamingIterableDataset(make_loader(data, tmp_path / "b"))
    seen = []
    for batch in ds:
        seen.append(batch["id"].tolist())
        if len(seen) == 3:
            break
    state = ds.state_dict()
    assert (state["epoch"], state["sample_in_epoch"]) == (0, 3 * BATCH)
    resumed = StreamingIterableDataset(make_loader(data, tmp_path / "c"))
    resumed.load_state_dict(state)
    assert seen + [b["id"].tolist() for b in resumed] == everything


def test_torch_workers_are_refused(data: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # What a DataLoader worker sees (starting a real one costs a torch import per process).
    from astream.adapters import _torch_impl

    monkeypatch.setattr(_torch_impl, "get_worker_info", lambda: object())
    with pytest.raises(UsageError, match="num_workers=0"):
        next(iter(StreamingIterableDataset(make_loader(data, tmp_path / "a"))))
