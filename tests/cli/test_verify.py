"""``astream verify``: every shard against index.json, locally and over HTTP."""

from __future__ import annotations

from pathlib import Path

from clikit import Run, assert_one_line_error, write_dataset

from astream._format.index import Index
from astream.testing import LoopbackServer


def _stored(dataset: Path, shard: int) -> Path:
    return dataset / Index.load(dataset / "index.json").shards[shard].stored.basename


def test_a_good_dataset_passes(cli: Run, main: Run, dataset: Path) -> None:
    result = cli("verify", str(dataset))
    assert result.returncode == 0, result.stderr
    assert "good" in result.stdout
    assert "sha1, xxh64" in result.stdout
    assert main("verify", str(dataset), "--hash", "xxh64", "-q").stdout == ""


def test_every_bad_shard_is_reported(cli: Run, dataset: Path) -> None:
    flipped, missing, short = _stored(dataset, 0), _stored(dataset, 2), _stored(dataset, 3)
    data = bytearray(flipped.read_bytes())
    data[-1] ^= 0xFF
    flipped.write_bytes(bytes(data))
    missing.unlink()
    short.write_bytes(short.read_bytes()[:-5])
    result = cli("verify", str(dataset))
    assert result.returncode == 1
    bad = [line for line in result.stdout.splitlines() if line.startswith("BAD")]
    assert len(bad) == 3, result.stdout
    assert flipped.name in bad[0]
    assert "sha1" in bad[0]
    assert missing.name in bad[1]
    assert "missing" in bad[1]
    assert short.name in bad[2]
    assert "bytes" in bad[2]
    assert "3 of" in result.stdout


def test_verify_over_http(main: Run, tmp_path: Path) -> None:
    dataset = write_dataset(tmp_path / "ds", compression=None, hashes=["md5"])
    with LoopbackServer(str(dataset)) as server:
        assert main("verify", server.url).returncode == 0
        target = _stored(dataset, 1)
        target.write_bytes(b"x" + target.read_bytes()[1:])
        result = main("verify", server.url)
        assert result.returncode == 1
        assert f"BAD  {target.name}: md5 is" in result.stdout


def test_bad_arguments_and_missing_datasets(cli: Run, main: Run, dataset: Path, tmp_path: Path) -> None:
    assert_one_line_error(cli("verify", str(dataset), "--hash", "crc7"), 2, "crc7")
    assert_one_line_error(main("verify", str(dataset), "--hash", "md5"), 2, "no md5")
    assert_one_line_error(main("verify", str(dataset), "--jobs", "0"), 2, "--jobs")
    assert_one_line_error(main("verify", str(tmp_path / "absent")), 1, "absent")
