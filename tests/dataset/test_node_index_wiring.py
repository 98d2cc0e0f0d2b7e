"""The dataset reads its index through the node's binary index: built once, mapped after,
rebuilt when corrupt or stale, and the same samples, order and fingerprint as index.json's."""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from astream import MDSWriter
from astream._cache.node_index import binary_path
from astream._cache.origin import private_index_folder
from astream._dataset.config import shard_identity
from astream._dataset.dataset import StreamingDataset
from astream._dataset.layout import SampleMap
from astream._dataset.mixture import stream_key
from astream._dataset.state import dataset_fingerprint, fingerprint_of
from astream._format.binindex import BinaryIndex, ShardTable
from astream._format.columns import columns_of
from astream._format.index import Index
from astream.errors import IndexFormatError

N = 120


@pytest.fixture(autouse=True)
def _private_cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("ASTREAM_CACHE_DIR", str(tmp_path / "astream-cache"))


@pytest.fixture
def remote(tmp_path: Path) -> Path:
    root = tmp_path / "remote"
    with MDSWriter(out=str(root), columns={"id": "int64", "s": "str"}, compression="zstd", hashes=["xxh64"],
                   size_limit="1kb") as writer:
        for i in range(N):
            writer.write({"id": i, "s": "x" * (i % 7)})
    return root


def _ids(ds: StreamingDataset) -> list[int]:
    return [int(s["id"]) for s in ds]


def _dataset(remote: Path, local: Path | None) -> StreamingDataset:
    if local is None:
        return StreamingDataset(local=str(remote), shuffle=True, batch_size=4)
    return StreamingDataset(remote=str(remote), local=str(local), shuffle=True, batch_size=4)


@pytest.mark.parametrize("cached", [True, False], ids=["cache-folder", "read-in-place"])
def test_the_dataset_maps_the_binary_index_and_a_second_one_reuses_it(remote: Path, tmp_path: Path,
                                                                        cached: bool) -> None:
    local = tmp_path / "cache" if cached else None
    ds = _dataset(remote, local)
    try:
        index = ds.indexes[0]
        assert isinstance(index.shards, ShardTable)
        folder = local or remote
        where = binary_path(str(folder / "index.json"), private_index_folder())
        assert os.path.exists(where)
        # Neither the user's folder nor a cache folder is written (their files are the dataset's).
        assert not [p.name for p in folder.iterdir() if "astream-v" in p.name]
        inode = os.stat(where).st_ino
        order = _ids(ds)
    finally:
        ds.close()
    again = _dataset(remote, local)
    try:
        assert os.stat(where).st_ino == inode  # mapped, not rebuilt
        assert _ids(again) == order
        assert sorted(order) == list(range(N))
    finally:
        again.close()


def test_order_and_fingerprint_equal_the_json_readers(remote: Path, tmp_path: Path) -> None:
    ds = _dataset(remote, tmp_path / "cache")
    try:
        parsed = Index.load(str(remote / "index.json"))
        identities = [shard_identity(sh) for sh in parsed.shards]
        assert ds.config.fingerprint(ds.indexes) == dataset_fingerprint(
            [{"shards": identities, "proportion": None, "repeat": None, "choose": None}])
        assert ds.config.fingerprint([parsed]) == ds.config.fingerprint(ds.indexes)
        assert columns_of(ds.indexes[0]).identity_xxh64 == stream_key(identities, "p").split("@")[0]
        walked, mapped = SampleMap([parsed], False), ds.sample_map
        assert np.array_equal(walked.starts, mapped.starts)
        assert list(walked.shard_local) == list(mapped.shard_local)
        assert [walked.layouts[i] for i in range(len(walked.layouts))] == [
            mapped.layouts[i] for i in range(len(mapped.layouts))]
        assert np.array_equal(walked.mean_record_bytes, mapped.mean_record_bytes)
    finally:
        ds.close()


def test_fingerprint_of_columns_equals_the_fingerprint_of_identities() -> None:
    rng = np.random.default_rng(3)
    for _ in range(20):
        streams, given = [], []
        for _ in range(int(rng.integers(0, 4))):
            shards = tuple((f"é{int(k)}/s.mds", int(k) % 9, int(k) * 7) for k in rng.integers(0, 1000, rng.integers(0, 5)))
            weights = {"proportion": float(rng.random()), "repeat": None, "choose": int(rng.integers(1, 9))}

            text = json.dumps([list(s) for s in shards]).encode()
            streams.append((SimpleNamespace(identity=lambda text=text: iter([text[:3], text[3:]])), weights))
            given.append({"shards": list(shards), **weights})
        assert fingerprint_of(streams) == dataset_fingerprint(given)  # type: ignore[arg-type]


@pytest.mark.parametrize("damage", ["truncate", "flip", "stale"])
def test_a_corrupt_or_stale_binary_index_is_rebuilt_never_trusted(remote: Path, tmp_path: Path, damage: str) -> None:
    local = tmp_path / "cache"
    first = _dataset(remote, local)
    first.close()
    index_json = str(local / "index.json")
    path = binary_path(index_json, private_index_folder())
    data = bytearray(Path(path).read_bytes())
    if damage == "truncate":
        Path(path).write_bytes(bytes(data[: len(data) // 2]))
    elif damage == "flip":
        data[len(data) // 3] ^= 0x10
        Path(path).write_bytes(bytes(data))
    else:  # the remote's index.json changed since the binary index was built: one shard fewer
        obj = json.loads((remote / "index.json").read_text())
        obj["shards"] = obj["shards"][:-1]
        (remote / "index.json").write_text(json.dumps(obj, sort_keys=True))
    if damage != "stale":
        with pytest.raises(IndexFormatError, match="binary index"):
            BinaryIndex.open(path, index_json)
    ds = _dataset(remote, local)
    try:
        expected = Index.load(str(remote / "index.json"))
        assert ds.indexes[0].shard_sizes == expected.shard_sizes
        assert sorted(_ids(ds)) == list(range(expected.num_samples))
        BinaryIndex.open(path, index_json).close()  # sound again
    finally:
        ds.close()


def test_a_table_pickles_as_its_file_and_refuses_a_rebuilt_one(remote: Path, tmp_path: Path) -> None:
    ds = _dataset(remote, tmp_path / "cache")
    try:
        table = ds.indexes[0].shards
        copy = pickle.loads(pickle.dumps(table))
        assert list(copy) == list(table)
        blob = pickle.dumps(table)
    finally:
        ds.close()
    obj = json.loads((remote / "index.json").read_text())
    obj["shards"] = obj["shards"][:2]
    (remote / "index.json").write_text(json.dumps(obj))
    _dataset(remote, tmp_path / "cache").close()  # rebuilt for the changed index
    with pytest.raises(IndexFormatError, match="was rebuilt"):
        pickle.loads(blob)


def test_a_malformed_index_json_fails_at_construction_as_before(remote: Path, tmp_path: Path) -> None:
    obj = json.loads((remote / "index.json").read_text())
    obj["shards"][2]["raw_data"]["basename"] = "../../escape.mds"
    (remote / "index.json").write_text(json.dumps(obj))
    with pytest.raises(IndexFormatError, match=r"shards\[2\]\.raw_data\.basename"):
        _dataset(remote, tmp_path / "cache")
    (remote / "index.json").write_text('{"version": 2, "shards": [')
    with pytest.raises(IndexFormatError, match="not valid JSON"):
        _dataset(remote, None)


def test_an_unwritable_place_for_the_binary_index_parses_the_json(remote: Path, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    blocked = tmp_path / "not-a-folder"
    blocked.write_text("")
    monkeypatch.setenv("ASTREAM_CACHE_DIR", str(blocked))
    ds = _dataset(remote, None)
    try:
        assert not isinstance(ds.indexes[0].shards, ShardTable)
        assert sorted(_ids(ds)) == list(range(N))
    finally:
        ds.close()
