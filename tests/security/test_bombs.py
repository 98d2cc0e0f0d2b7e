"""Decompression bombs in every codec cost the size the index declares, not the size they
expand to: each case runs in a child process whose address space is capped at its size
before the case + 64 MiB (``RLIMIT_AS``), and ends in an ``AstreamError`` naming the shard
(issue 32, finding 5). A 768 MiB bomb before the fix: a ``MemoryError`` there, or 0.7-1.6 GB
without the cap."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hostile import BOMB, bomb, run_capped, small_tar, tar_bomb

from astream import MDSWriter
from astream._cache.wds_index import WDS_INDEX, dump_tars
from astream._format.webdataset import TarSummary

CODECS = ["zstd", "gz", "bz2", "br", "snappy"]


@pytest.fixture(scope="module")
def bombs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Per codec, a one-shard MDS dataset whose stored file is a bomb (index.json: ~4 KB raw)."""
    root = tmp_path_factory.mktemp("bombs")
    for family in CODECS:
        folder = root / family
        with MDSWriter(out=str(folder), columns={"x": "bytes"}, compression=family) as writer:
            writer.write({"x": b"a" * 4000})
        index = json.loads((folder / "index.json").read_text())
        shard = index["shards"][0]
        data = bomb(family)
        (folder / shard["zip_data"]["basename"]).write_bytes(data)
        shard["zip_data"].update(bytes=len(data), hashes={})
        (folder / "index.json").write_text(json.dumps(index))
    return root


def _refused(outcome: str, cls: str, shard: str) -> None:
    assert outcome.startswith(f"{cls}: "), outcome
    assert shard in outcome
    assert "index.json records" in outcome  # refused at the declared size, not at the cap
    assert "MemoryError" not in outcome


def test_one_shot_in_every_codec(bombs: Path) -> None:
    got = run_capped("from astream import LocalDataset", {
        family: f"LocalDataset({str(bombs / family)!r})[0]" for family in CODECS})
    for family in CODECS:
        _refused(got[family], "CompressionError", f"{family}/shard.00000.mds.{family} (shard 0)")


def test_streamed_install_in_every_codec(bombs: Path, tmp_path: Path) -> None:
    # The whole path of a stream: the node agent, its engine, the cache's sink; the child's
    # threads get small stacks so that starting them fits in the cap too.
    got = run_capped("import threading\nthreading.stack_size(1 << 20)\nfrom astream import StreamingDataset", {
        family: f"StreamingDataset(remote={str(bombs / family)!r}, local={str(tmp_path / family)!r})[0]"
        for family in CODECS})
    for family in CODECS:
        _refused(got[family], "ShardFormatError", f"{family}/shard.00000.mds.{family}")
        assert not list((tmp_path / family).glob("shard.*")), "nothing of it stays in the cache"


def test_a_gzip_tar(tmp_path: Path) -> None:
    # A 768 MiB member in a 0.8 MB .tar.gz: its scan streams it (no memory for the member),
    # and a written index that declares a small tar stops the reader at that size.
    (tmp_path / "data").mkdir()
    (tmp_path / "data" / "bomb.tar.gz").write_bytes(tar_bomb())
    real = tmp_path / "data" / "bomb.tar.gz"
    declared = TarSummary(1, ("bin",), 4096, len(small_tar({"k/000.bin": bytes(4096)})))
    (tmp_path / "data" / WDS_INDEX).write_bytes(dump_tars([("bomb.tar.gz", real.stat().st_size, None, declared)]))
    got = run_capped("from astream import StreamingDataset\nfrom astream._format.webdataset import scan_tar", {
        "scan": f"s = scan_tar({str(real)!r}, 'bomb.tar.gz')\nassert (s.samples, s.largest) == (1, {BOMB}), s",
        "read": f"StreamingDataset(remote={str(tmp_path / 'data')!r}, local={str(tmp_path / 'c')!r}, "
                "format='webdataset')[0]",
    })
    assert got["scan"] == "ok"
    _refused(got["read"], "ShardFormatError", "bomb.tar.gz (shard 0)")
