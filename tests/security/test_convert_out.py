"""``astream convert --overwrite`` replaces a dataset, never a folder (issue 32, finding 8):
in the input's folder it refuses with a clear error and deletes nothing; a folder holding
anything besides a dataset is refused before anything is removed."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from astream import LocalDataset
from astream.cli import main


def _jsonl(path: Path, rows: int) -> None:
    path.write_text("".join(json.dumps({"id": i, "text": f"row {i}"}) + "\n" for i in range(rows)))


def _convert(capsys: pytest.CaptureFixture[str], *args: str) -> tuple[int, str]:
    code = main(["convert", *args, "--quiet"])
    return code, capsys.readouterr().err


def test_the_inputs_folder_is_never_replaced(tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                             capsys: pytest.CaptureFixture[str]) -> None:
    _jsonl(tmp_path / "in.jsonl", 20)
    (tmp_path / "notes.txt").write_text("mine")
    monkeypatch.chdir(tmp_path)
    code, err = _convert(capsys, "in.jsonl", "-o", ".", "--overwrite")
    assert code == 2
    assert "holds the input in.jsonl" in err
    assert sorted(os.listdir(tmp_path)) == ["in.jsonl", "notes.txt"]
    (tmp_path / "data").mkdir()
    _jsonl(tmp_path / "data" / "part.jsonl", 5)
    code, err = _convert(capsys, str(tmp_path / "data"), "-o", str(tmp_path), "--overwrite")  # a folder above
    assert code == 2
    assert "holds the input" in err
    assert sorted(os.listdir(tmp_path)) == ["data", "in.jsonl", "notes.txt"]


def test_only_a_dataset_is_replaced(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _jsonl(tmp_path / "a.jsonl", 300)
    _jsonl(tmp_path / "b.jsonl", 40)
    out = tmp_path / "out"
    assert _convert(capsys, str(tmp_path / "a.jsonl"), "-o", str(out), "--parts", "2", "--workers", "2",
                    "--size-limit", "4kb")[0] == 0
    assert len(LocalDataset(str(out))) == 300
    (out / "notes.txt").write_text("mine")
    code, err = _convert(capsys, str(tmp_path / "b.jsonl"), "-o", str(out), "--overwrite")
    assert code == 2
    assert "holds 'notes.txt', which is not part of its dataset" in err
    assert len(LocalDataset(str(out))) == 300  # nothing was removed
    (out / "notes.txt").unlink()
    assert _convert(capsys, str(tmp_path / "b.jsonl"), "-o", str(out), "--overwrite")[0] == 0
    assert len(LocalDataset(str(out))) == 40
    assert sorted(os.listdir(out)) == ["index.json", "shard.00000.mds"]  # the old shards went with it


def test_a_folder_without_a_dataset_is_refused(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    _jsonl(tmp_path / "in.jsonl", 5)
    (tmp_path / "home").mkdir()
    (tmp_path / "home" / "thesis.tex").write_text("years of work")
    code, err = _convert(capsys, str(tmp_path / "in.jsonl"), "-o", str(tmp_path / "home"), "--overwrite")
    assert code == 2
    assert "holds no dataset astream can read" in err
    assert os.listdir(tmp_path / "home") == ["thesis.tex"]
