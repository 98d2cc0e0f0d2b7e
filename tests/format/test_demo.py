"""`make demo`: writes a dataset with MDSWriter, describes it, reads it back."""

from __future__ import annotations

from pathlib import Path

import pytest

from astream import LocalDataset
from astream.cli._demo import COLUMNS, NUM_SAMPLES, run_demo


def test_demo_round_trips_and_describes_the_dataset(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    assert run_demo(str(tmp_path)) == 0
    out = capsys.readouterr().out
    assert "all equal" in out
    for name, encoding in COLUMNS.items():
        assert name in out
        assert encoding in out
    with LocalDataset(tmp_path / "demo-mds", validate_hash="xxh64") as ds:
        assert len(ds) == NUM_SAMPLES
        assert ds.index.shards[0].compression == "zstd"
    assert run_demo(str(tmp_path)) == 0  # runs again over its own output
