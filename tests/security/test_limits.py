"""Sizes and counts other people wrote are bounded where they enter (issue 32, finding 11):
an index file over the cap is refused as it arrives and leaves nothing in the cache;
counts past int64, JSON nested thousands deep and a resume state naming 10**9 canonical
nodes are clear errors that cost nothing."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path

import pytest
from hostile import run_capped

from astream import Loader, MDSWriter, StreamingDataset
from astream._cache import index_file
from astream._cache.origin import ORIGIN_NAME
from astream._cache.wds_index import load_tars
from astream._format.index import MAX_INDEX_BYTES, Index
from astream.errors import DownloadError, IndexFormatError, StateError
from astream.sampling import plan_epoch
from astream.testing import LoopbackServer

HUGE = 1_200_000_000  # the audit's index: 1.2 GB


def _sparse(path: Path, size: int) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "wb") as fh:
        fh.truncate(size)  # no disk, no time


def test_a_huge_local_index(tmp_path: Path) -> None:
    _sparse(tmp_path / "remote" / "index.json", HUGE)
    got = run_capped("from astream import LocalDataset, StreamingDataset", {
        "local": f"LocalDataset({str(tmp_path / 'remote')!r})",
        "stream": f"StreamingDataset(remote={str(tmp_path / 'remote')!r}, local={str(tmp_path / 'cache')!r})",
    })
    assert got["local"].startswith("IndexFormatError: "), got["local"]
    assert f"{HUGE} bytes, over the {MAX_INDEX_BYTES >> 20} MiB" in got["local"]
    assert got["stream"].startswith("DownloadError: "), got["stream"]
    assert "index.json: more than" in got["stream"]
    assert sorted(os.listdir(tmp_path / "cache")) == [ORIGIN_NAME]  # no index, no temporary (whose cache it is)


def test_a_huge_index_over_http_stops_as_it_arrives(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(index_file, "MAX_INDEX_BYTES", 1 << 20)  # the cap, scaled down: 3 MB here
    (tmp_path / "remote").mkdir()
    (tmp_path / "remote" / "index.json").write_bytes(b" " * (3 << 20))
    with LoopbackServer(str(tmp_path / "remote")) as server, \
            pytest.raises(DownloadError, match=r"index\.json: more than 1048576 bytes"):
        StreamingDataset(remote=server.url, local=str(tmp_path / "cache"))
    assert os.listdir(tmp_path / "cache") == [ORIGIN_NAME]


def _shard(samples: object) -> dict[str, object]:
    return {"version": 2, "format": "mds", "samples": samples, "compression": None, "hashes": [],
            "size_limit": None, "column_names": ["x"], "column_encodings": ["int"], "column_sizes": [8],
            "raw_data": {"basename": "s.mds", "bytes": 16, "hashes": {}}, "zip_data": None}


@pytest.mark.parametrize("shards", [[_shard(2**63)], [_shard(2**62), _shard(2**62)], [_shard(10**30)]])
def test_counts_past_int64(shards: list[dict[str, object]]) -> None:
    with pytest.raises(IndexFormatError, match=r"(below 2\*\*63|more than 2\*\*63 - 1 samples)"):
        Index.from_bytes(json.dumps({"version": 2, "shards": shards}).encode(), "index.json")


def test_json_nested_deep() -> None:
    deep = b"[" * 100_000 + b"]" * 100_000
    with pytest.raises(IndexFormatError, match="nested too deep"):
        Index.from_bytes(deep, "index.json")
    with pytest.raises(IndexFormatError, match=r"index\.wds\.json"):
        load_tars(b'{"version": 1, "format": "webdataset", "files": ' + deep + b"}", "index.wds.json")


def test_a_state_with_a_billion_canonical_nodes(tmp_path: Path) -> None:
    with MDSWriter(out=str(tmp_path / "ds"), columns={"x": "int"}) as writer:
        for i in range(50):
            writer.write({"x": i})
    ds = StreamingDataset(local=str(tmp_path / "ds"), batch_size=5, shuffle=True)
    loader = Loader(ds, batch_size=5)
    state = {**loader.state_dict(), "num_canonical_nodes": 10**9}
    start = time.monotonic()
    with pytest.raises(StateError, match=r"num_canonical_nodes=1000000000 is over 1048576"):
        loader.load_state_dict(state)
    assert time.monotonic() - start < 1.0  # refused before a plan is made (it took ~2 GB, then MemoryError)
    with pytest.raises(ValueError, match="num_canonical_nodes=1000000000"):
        plan_epoch([{"shard_sizes": [50]}], num_canonical_nodes=10**9, batch_size=5)
    assert len(list(loader)) == 10  # the loader still works
