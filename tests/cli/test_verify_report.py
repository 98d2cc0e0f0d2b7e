"""``astream verify --report``: every bad sample and shard ahead of time, and the quarantine
file a dataset then skips without reading (over loopback HTTP)."""

from __future__ import annotations

import json
import logging
import sys
from pathlib import Path

import numpy as np
import pytest
from clikit import Run, assert_one_line_error

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "dataset"))

import bad_data as bd

from astream._dataset.dataset import StreamingDataset
from astream._dataset.loader import Loader
from astream._sampling.substitute import in_batch
from astream.errors import ConfigError
from astream.testing import LoopbackServer


@pytest.fixture
def planted(tmp_path: Path) -> tuple[Path, set[int]]:
    """Two record faults in a zstd shard and one flipped shard (xxh64): the ids they make bad."""
    root = tmp_path / "remote"
    shards = bd.write_mds(root, 60, compression="zstd", hashes=["xxh64"])
    bd.corrupt_mds_record(root, 5)
    bd.corrupt_mds_record(root, 47)
    flipped = shards[2]
    bd.flip_byte(root / flipped["zip_data"]["basename"])
    first = sum(s["samples"] for s in shards[:2])
    return root, {5, 47} | set(range(first, first + flipped["samples"]))


def test_the_report_lists_every_bad_sample_and_shard(main: Run, planted: tuple[Path, set[int]],
                                                     tmp_path: Path) -> None:
    root, bad = planted
    out = tmp_path / "quarantine.json"
    with LoopbackServer(str(root)) as server:
        result = main("verify", server.url, "--report", "--quarantine", str(out), "-q")
    assert result.returncode == 1
    lines = [line for line in result.stdout.splitlines() if line.startswith("BAD")]
    assert len(lines) == 3, result.stdout
    assert "sample 5 (record 5 of shard.00000.mds, decode)" in lines[0]
    assert "BAD  shard shard.00002.mds: all" in lines[1]
    assert "(hash)" in lines[1]
    assert "sample 47" in lines[2]
    assert f"{len(bad)} of 60 samples are bad, in 3 of" in result.stdout
    body = json.loads(out.read_text())
    assert body["astream_quarantine"] == 1
    assert len(body["bad"]) == len(bad)
    assert {e["reason"] for e in body["bad"]} == {"decode", "hash"}


def test_a_dataset_given_the_quarantine_never_reads_those_samples(main: Run, planted: tuple[Path, set[int]],
                                                                  tmp_path: Path,
                                                                  caplog: pytest.LogCaptureFixture) -> None:
    root, bad = planted
    out = tmp_path / "q.json"
    with LoopbackServer(str(root)) as server:
        assert main("verify", server.url, "--report", "--quarantine", str(out), "-q").returncode == 1
        caplog.set_level(logging.WARNING, "astream.dataset")
        caplog.set_level(logging.WARNING, "astream.coord")
        caplog.clear()  # (what the report's own reading logged)
        # A budget of 0: the listed samples are known, not met by surprise.
        ds = StreamingDataset(remote=server.url, local=str(tmp_path / "cache"), batch_size=4, shuffle=True,
                              validate_hash="xxh64", on_bad_sample="skip", max_bad_samples=0, quarantine=out)
        try:
            loader = Loader(ds, num_workers=2, worker_mode="thread")
            planned = loader.batch_ids(0)
            got = [[int(i) for i in b["id"]] for b in loader]
            stats = loader.stats()
        finally:
            ds.close()
    assert not [r for r in caplog.records if "on_bad_sample='skip': sample" in r.getMessage()]  # never read
    assert not [r for r in caplog.records if "failed for" in r.getMessage()]  # the lost shard: not fetched
    assert stats.bad_samples == len(bad)
    assert stats.quarantined == ()
    for want, have in zip(planned, got, strict=True):
        src = in_batch(np.isin(want, list(bad)))
        if src is None:
            assert len(set(have)) == 1
        else:
            assert have == [int(want[s]) for s in src]


def test_a_good_dataset_reports_nothing(main: Run, tmp_path: Path) -> None:
    root = tmp_path / "remote"
    bd.write_mds(root, 30, hashes=["xxh64"])
    result = main("verify", str(root), "--report")
    assert result.returncode == 0, result.stderr
    assert "all 30 samples good" in result.stdout
    assert "xxh64 checked" in result.stdout


def test_a_quarantine_of_other_data_or_without_skip_is_refused(main: Run, planted: tuple[Path, set[int]],
                                                              tmp_path: Path) -> None:
    root, _ = planted
    out = tmp_path / "q.json"
    assert main("verify", str(root), "--report", "--quarantine", str(out), "-q").returncode == 1
    other = tmp_path / "other"
    bd.write_mds(other, 40)
    with pytest.raises(ConfigError, match="whose shards no stream of this dataset has"):
        StreamingDataset(local=str(other), on_bad_sample="skip", quarantine=out)
    with pytest.raises(ConfigError, match="only with on_bad_sample='skip'"):
        StreamingDataset(local=str(root), quarantine=out)
    (tmp_path / "junk.json").write_text("{}")
    with pytest.raises(ConfigError, match="not an astream quarantine file"):
        StreamingDataset(local=str(other), on_bad_sample="skip", quarantine=tmp_path / "junk.json")
    assert_one_line_error(main("verify", str(root), "--quarantine", str(out)), 2, "only with --report")
    assert_one_line_error(main("verify", str(root), "--report", "--jobs", "2"), 2, "--jobs")
