"""``astream inspect``: a local folder, a remote URL (index.json only), and broken datasets."""

from __future__ import annotations

import json
from pathlib import Path

from clikit import COLUMNS, NUM_SAMPLES, Run, assert_one_line_error

from astream._format.index import Index
from astream.testing import LoopbackServer


def test_inspect_reports_what_index_json_says(cli: Run, main: Run, dataset: Path) -> None:
    index = Index.load(dataset / "index.json")
    result = main("inspect", str(dataset), "--json")
    assert result.returncode == 0, result.stderr
    info = json.loads(result.stdout)
    assert info["samples"] == NUM_SAMPLES
    assert info["shards"] == len(index.shards) > 1
    assert {c["name"]: c["encoding"] for c in info["columns"]} == COLUMNS
    assert {c["name"]: c["size"] for c in info["columns"]}["vec"] == 16
    assert info["compression"] == ["zstd"]
    assert info["hashes"] == ["sha1", "xxh64"]
    assert info["raw_bytes"] == sum(s.raw_data.bytes for s in index.shards)
    assert info["stored_bytes"] == sum(s.zip_data.bytes for s in index.shards if s.zip_data)
    assert info["shard_list"][1]["hashes"] == dict(index.shards[1].zip_data.hashes)  # type: ignore[union-attr]

    text = cli("inspect", str(dataset))
    assert text.returncode == 0
    assert f"samples      {NUM_SAMPLES}" in text.stdout
    assert "ndarray:float32:4" in text.stdout
    assert index.shards[0].zip_data.hashes["sha1"] in text.stdout  # type: ignore[union-attr]


def test_inspect_a_remote_fetches_only_the_index(main: Run, dataset: Path) -> None:
    with LoopbackServer(str(dataset.parent)) as server:
        result = main("inspect", f"{server.url}/ds", "--json")
        assert result.returncode == 0, result.stderr
        assert json.loads(result.stdout)["samples"] == NUM_SAMPLES
        assert server.count("ds/index.json") == 1
        assert server.count("ds/shard.*") == 0
        assert_one_line_error(main("inspect", f"{server.url}/nothing"), 1, "nothing/index.json")


def test_inspect_a_split_and_hints_at_splits(main: Run, dataset: Path) -> None:
    root = dataset.parent
    assert main("inspect", str(root), "--split", "ds").returncode == 0
    assert_one_line_error(main("inspect", str(root)), 1, "no index.json", "--split", "ds")


def test_inspect_missing_or_corrupt(cli: Run, main: Run, tmp_path: Path, dataset: Path) -> None:
    assert_one_line_error(main("inspect", str(tmp_path / "absent")), 1, "absent", "no such directory")
    index = json.loads((dataset / "index.json").read_text())
    del index["shards"][1]["samples"]
    (dataset / "index.json").write_text(json.dumps(index))
    assert_one_line_error(cli("inspect", str(dataset)), 1, "shards[1].samples")
