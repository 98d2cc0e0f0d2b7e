"""Names other people wrote never become paths outside the folder they belong in: keys
of a bucket's listing, shard names of an index, ``split``; checked where they enter,
before anything is fetched or created (issue 32, findings 2 and 10)."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest
from hostile import small_tar

from astream import LocalDataset, StreamingDataset
from astream._cache.wds_index import load_tars
from astream._format.index import Index
from astream._format.names import checked_listing, unsafe_name
from astream._storage.base import ObjectInfo
from astream.cli import main as cli
from astream.errors import ConfigError, IndexFormatError

TAR = small_tar({"k/000.cls": b"1", "k/001.cls": b"2"})


def _outside(root: Path, inside: Path) -> list[str]:
    """Files and folders under ``root`` that are not under ``inside`` (nor ``inside``'s parents)."""
    keep = {inside, *inside.parents}
    out = []
    for folder, dirs, files in os.walk(root):
        for name in (*dirs, *files):
            path = Path(folder, name)
            if path not in keep and inside not in path.parents:
                out.append(str(path.relative_to(root)))
    return sorted(out)


@pytest.mark.parametrize("name", ["../../escape.tar", "a/../../../escape.tar", "/abs.tar", "./x.tar", "a//b.tar",
                                  "a/./b.tar", "nul\0.tar", "back\\slash.tar", "", "."])
def test_the_rule(name: str) -> None:
    assert unsafe_name(name) is not None
    with pytest.raises(IndexFormatError, match="safe relative paths"):
        checked_listing("s3://b/p", [("ok.tar", ObjectInfo(1, None)), (name, ObjectInfo(1, None))])


@pytest.mark.parametrize("name", ["a.tar", "dir/sub/a.tar", "..a.tar", "a..tar", ".hidden.tar", "ünï.tar"])
def test_safe_names_pass(name: str) -> None:
    assert unsafe_name(name) is None


@pytest.mark.parametrize("key", ["wds/../../escape.tar", "wds//abs.tar"])
def test_s3_listing_is_refused_before_any_fetch(s3: Any, tmp_path: Path, key: str) -> None:
    prefix = key.split("/")[0] + "-" + str(abs(hash(key)) % 10**6)
    s3.put_object(Bucket="hostile", Key=f"{prefix}/good.tar", Body=TAR)
    s3.put_object(Bucket="hostile", Key=key.replace("wds", prefix, 1), Body=TAR)
    local = tmp_path / "a" / "b" / "cache"
    with pytest.raises(IndexFormatError, match=r"the listing names .*(escape|abs)\.tar"):
        StreamingDataset(remote=f"s3://hostile/{prefix}", local=str(local), format="webdataset")
    assert _outside(tmp_path, local) == []
    assert not local.exists() or not [p for p in local.rglob("*") if p.suffix == ".tar"]


def test_a_folder_marker_is_not_a_name(s3: Any, tmp_path: Path) -> None:
    s3.put_object(Bucket="hostile", Key="marked/", Body=b"")
    s3.put_object(Bucket="hostile", Key="marked/a.tar", Body=TAR)
    ds = StreamingDataset(remote="s3://hostile/marked", local=str(tmp_path / "c"), format="webdataset")
    assert len(ds) == 2


def test_astream_index_creates_nothing_outside(s3: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                               capsys: pytest.CaptureFixture[str]) -> None:
    scratch = tmp_path / "t1" / "t2" / "t3"
    scratch.mkdir(parents=True)
    monkeypatch.setenv("TMPDIR", str(scratch))  # where the command's scratch folder goes
    s3.put_object(Bucket="hostile", Key="idx/a.tar", Body=TAR)
    s3.put_object(Bucket="hostile", Key="idx/../../../made-by-astream/escape.tar", Body=TAR)
    assert cli(["index", "s3://hostile/idx", "--format", "webdataset"]) != 0
    assert "made-by-astream/escape.tar" in capsys.readouterr().err
    assert _outside(tmp_path, scratch) == []


def test_a_written_wds_index_is_checked_too() -> None:
    entry = {"name": "../x.tar", "bytes": 10, "etag": None, "samples": 1, "extensions": ["cls"], "largest": 1,
             "tar_bytes": 10}
    with pytest.raises(IndexFormatError, match=r"'\.\./x\.tar'"):
        load_tars(json.dumps({"version": 1, "format": "webdataset", "files": [entry]}).encode(), "index.wds.json")


def _index(basename: str) -> bytes:
    shard = {"version": 2, "format": "mds", "samples": 1, "compression": None, "hashes": [], "size_limit": None,
             "column_names": ["x"], "column_encodings": ["int"], "column_sizes": [8],
             "raw_data": {"basename": basename, "bytes": 16, "hashes": {}}, "zip_data": None}
    return json.dumps({"version": 2, "shards": [shard]}).encode()


@pytest.mark.parametrize("basename", ["shard\0.mds", ".", "./shard.mds", "a/./b.mds", "a//b.mds", "../s.mds",
                                      "/etc/passwd"])
def test_index_basenames(basename: str) -> None:
    with pytest.raises(IndexFormatError, match=r"basename is not a safe relative file name"):
        Index.from_bytes(_index(basename), "index.json")


@pytest.mark.parametrize("split", ["../up", "/abs", "a/../../b", "nul\0"])
def test_a_split_outside_is_refused(tmp_path: Path, split: str) -> None:
    remote, local = tmp_path / "remote", tmp_path / "x" / "local"
    remote.mkdir()
    with pytest.raises(ConfigError, match=r"split=.*a split is a sub-folder"):
        StreamingDataset(remote=str(remote), local=str(local), split=split)
    with pytest.raises(ConfigError, match=r"split=.*a split is a sub-folder"):
        LocalDataset(str(local), split=split)
    assert not local.exists()
    assert sorted(os.listdir(tmp_path)) == ["remote"]
