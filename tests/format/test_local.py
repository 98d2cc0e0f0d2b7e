"""LocalDataset: indexing, batches across shards, compressed shards, hashes, and bad datasets."""

from __future__ import annotations

import json
import os
import shutil
import stat
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from astream import LocalDataset, MDSWriter
from astream._format.encodings import _REGISTRY, Encoding, get_encoding, register_encoding
from astream.errors import (
    CompressionError,
    ConfigError,
    EncodingError,
    HashMismatchError,
    IndexFormatError,
    SampleIndexError,
    ShardFormatError,
    UnsafeTypeError,
)

COLUMNS = {"id": "int", "x": "ndarray:uint8:4", "t": "str", "v": "ndarray:int16"}


def _sample(i: int) -> dict[str, Any]:
    return {"id": i, "x": np.full(4, i % 256, np.uint8), "t": str(i) * (i % 4), "v": np.arange(i % 5 + 1, dtype=np.int16)}


def _write(root: Path, n: int = 40, **kwargs: Any) -> Path:
    kwargs.setdefault("size_limit", 400)
    with MDSWriter(root, kwargs.pop("columns", COLUMNS), **kwargs) as writer:
        for i in range(n):
            writer.write(_sample(i))
    return root


@pytest.fixture(scope="module")
def plain(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _write(tmp_path_factory.mktemp("plain") / "ds", hashes=["sha1", "xxh64"])


def _edit_index(root: Path, edit: Any) -> None:
    index = json.loads((root / "index.json").read_text())
    edit(index)
    (root / "index.json").write_text(json.dumps(index))


def _copy(src: Path, tmp_path: Path) -> Path:
    return Path(shutil.copytree(src, tmp_path / "copy"))


def test_indexing(plain: Path) -> None:
    with LocalDataset(plain) as ds:
        assert len(ds) == ds.size == 40
        assert ds.num_shards > 3
        assert ds.columns == {"id": "int", "t": "str", "v": "ndarray:int16", "x": "ndarray:uint8:4"}
        assert ds[0]["id"] == 0
        assert ds[-1]["id"] == 39
        assert ds[np.int64(7)]["t"] == "777"
        assert [s["id"] for s in ds] == list(range(40))
        for bad in (40, -41):
            with pytest.raises(SampleIndexError, match=f"sample index {bad} is out of range for 40 samples"):
                ds[bad]


def test_get_batch_across_shards_keeps_order(plain: Path) -> None:
    with LocalDataset(plain) as ds:
        ids = [39, 0, 17, 17, -2, 5, 33]
        batch = ds.get_batch(np.array(ids))
        want = [i % 40 for i in ids]
        assert batch["id"].tolist() == want
        assert batch["x"].shape == (7, 4)
        assert batch["x"][:, 0].tolist() == want
        assert batch["t"] == [str(i) * (i % 4) for i in want]
        assert [v.tolist() for v in batch["v"]] == [list(range(i % 5 + 1)) for i in want]
        empty = ds.get_batch([])
        assert empty["x"].shape == (0, 4)
        assert empty["t"] == []
        with pytest.raises(IndexError, match="out of range"):
            ds.get_batch([1, 40])


@pytest.mark.parametrize("columns", [{"id": "int64", "f": "ndarray:float32:3"}, COLUMNS], ids=["fixed", "mixed"])
def test_shuffled_batch_over_many_shards_equals_samples_read_one_by_one(tmp_path: Path, columns: dict[str, str]) -> None:
    # The one-pass gather of a batch spread over shards (fixed-size records) and the
    # per-shard decode + scatter (others) must give what reading each sample gives.
    with MDSWriter(tmp_path / "ds", columns, size_limit=200) as writer:
        for i in range(120):
            sample = _sample(i)
            writer.write({k: sample[k] if k in sample else np.full(3, i / 7, np.float32) for k in columns})
    with LocalDataset(tmp_path / "ds") as ds:
        assert ds.num_shards > 10
        ids = np.random.default_rng(5).integers(-120, 120, 64)
        batch = ds.get_batch(ids)
        for k, i in enumerate(ids.tolist()):
            one = ds[i]
            for name in columns:
                assert np.array_equal(np.asarray(batch[name][k]), np.asarray(one[name])), (name, i)
        if "t" not in columns:
            assert isinstance(batch["f"], np.ndarray)
            assert batch["f"].shape == (64, 3)
            assert batch["f"].flags.writeable


@pytest.mark.parametrize("compression", ["zstd", "gz:1", "bz2", "br:3", "snappy"])
def test_compressed_shards_are_read_without_writing_to_the_directory(tmp_path: Path, compression: str) -> None:
    root = _write(tmp_path / "ds", compression=compression, hashes=["md5"])
    before = sorted(os.listdir(root))
    root.chmod(stat.S_IRUSR | stat.S_IXUSR)  # read-only, like a mounted bucket
    try:
        with LocalDataset(root, validate_hash="md5") as ds:
            assert [s["id"] for s in ds] == list(range(40))
            assert ds.get_batch([3, 30])["id"].tolist() == [3, 30]
    finally:
        root.chmod(stat.S_IRWXU)
    assert sorted(os.listdir(root)) == before


def test_a_raw_file_beside_the_compressed_one_is_preferred(tmp_path: Path) -> None:
    root = _write(tmp_path / "ds", compression="zstd")
    index = json.loads((root / "index.json").read_text())
    first = index["shards"][0]
    with LocalDataset(root) as ds:
        raw = bytes(ds.shard(0).buffer)
    (root / first["raw_data"]["basename"]).write_bytes(raw)
    (root / first["zip_data"]["basename"]).unlink()
    with LocalDataset(root) as ds:
        assert ds[0]["id"] == 0


def test_split(tmp_path: Path) -> None:
    _write(tmp_path / "ds" / "train", n=10)
    _write(tmp_path / "ds" / "val", n=3)
    assert len(LocalDataset(tmp_path / "ds", split="train")) == 10
    assert len(LocalDataset(tmp_path / "ds", split="val")) == 3
    with pytest.raises(IndexFormatError, match=r"no index\.json"):
        LocalDataset(tmp_path / "ds")


def test_hash_mismatch_names_the_file(plain: Path, tmp_path: Path) -> None:
    root = _copy(plain, tmp_path)
    path = root / "shard.00002.mds"
    data = bytearray(path.read_bytes())
    data[-1] ^= 1
    path.write_bytes(bytes(data))
    with LocalDataset(root, validate_hash="xxh64") as ds:
        assert ds[0]["id"] == 0  # other shards are fine
        first = ds._starts[2]
        with pytest.raises(HashMismatchError, match=r"shard\.00002\.mds: xxh64 digest"):
            ds[first]
    with LocalDataset(root) as ds:  # without validation the flipped bit goes unnoticed
        ds[first]


def test_validate_hash_must_be_known_and_recorded(plain: Path) -> None:
    with pytest.raises(ConfigError, match="not a known hash"):
        LocalDataset(plain, validate_hash="crc32")
    with pytest.raises(ConfigError, match=r"records only \['sha1', 'xxh64'\]"):
        LocalDataset(plain, validate_hash="md5")


@pytest.mark.parametrize(
    ("edit", "error", "match"),
    [
        (lambda ix: ix.update(version=3), IndexFormatError, r"index\.version must be 2"),
        (lambda ix: ix["shards"][1].pop("samples"), IndexFormatError, r"shards\[1\]\.samples is missing"),
        (lambda ix: ix["shards"][0]["raw_data"].update(basename="../x.mds"), IndexFormatError, "not a safe"),
        (lambda ix: ix["shards"][0].update(column_encodings=["int", "nope", "ndarray:int16", "ndarray:uint8:4"]),
         EncodingError, r"shard 0 \(shard\.00000\.mds\), column 't'.*unknown encoding 'nope'"),
        (lambda ix: ix["shards"][0].update(column_sizes=[8, None, None, 5]), IndexFormatError, r"column_sizes\[3\] is 5"),
        (lambda ix: ix["shards"][0].update(compression="lz4", zip_data=ix["shards"][0]["raw_data"]),
         CompressionError, "shard 0.*unknown compression 'lz4'"),
        (lambda ix: ix["shards"][2].update(column_names=["a", "id", "t", "v"]), IndexFormatError, "shard 2 has columns"),
        (lambda ix: ix["shards"][0].update(format="json"), IndexFormatError, "raw_meta"),
        (lambda ix: ix["shards"][0].update(zip_data=ix["shards"][0]["raw_data"]), IndexFormatError,
         r"shards\[0\]\.zip_data describes a compressed file although compression is null"),
    ],
)
def test_bad_index(plain: Path, tmp_path: Path, edit: Any, error: type[Exception], match: str) -> None:
    root = _copy(plain, tmp_path)
    _edit_index(root, edit)
    with pytest.raises(error, match=match):
        LocalDataset(root)


def test_unreadable_index(tmp_path: Path) -> None:
    (tmp_path / "index.json").write_text('{"shards": [')
    with pytest.raises(IndexFormatError, match="not valid JSON"):
        LocalDataset(tmp_path)


def test_count_disagreeing_with_index(plain: Path, tmp_path: Path) -> None:
    root = _copy(plain, tmp_path)
    _edit_index(root, lambda ix: ix["shards"][1].update(samples=ix["shards"][1]["samples"] + 1))
    with LocalDataset(root) as ds, pytest.raises(ShardFormatError, match=r"shard\.00001\.mds \(shard 1\).*index\.json says"):
        ds.get_batch(range(len(ds)))


def test_truncated_or_missing_shard(plain: Path, tmp_path: Path) -> None:
    root = _copy(plain, tmp_path)
    data = (root / "shard.00001.mds").read_bytes()
    (root / "shard.00001.mds").write_bytes(data[:-3])
    os.unlink(root / "shard.00003.mds")
    with LocalDataset(root) as ds:
        with pytest.raises(ShardFormatError, match=r"shard\.00001\.mds \(shard 1\).*bytes, index\.json says"):
            ds.shard(1)
        with pytest.raises(ShardFormatError, match=r"shard\.00003\.mds \(shard 3\): cannot open"):
            ds.shard(3)


def test_pickle_needs_opt_in(tmp_path: Path) -> None:
    with MDSWriter(tmp_path / "ds", {"obj": "pkl", "id": "int"}) as writer:
        writer.write({"obj": {"a": (1, 2)}, "id": 0})
    with pytest.raises(UnsafeTypeError, match=r"index\.json: shard 0 .*column 'obj'.*allow_unsafe_types=True"):
        LocalDataset(tmp_path / "ds")
    with LocalDataset(tmp_path / "ds", allow_unsafe_types=True) as ds:
        assert ds[0]["obj"] == {"a": (1, 2)}


def test_many_shards_stay_within_the_open_limit(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import astream._format.local as local

    monkeypatch.setattr(local, "_MAX_OPEN_SHARDS", 3)
    root = _write(tmp_path / "ds", n=40, size_limit=250)
    with LocalDataset(root) as ds:
        assert ds.num_shards > 6
        assert [s["id"] for s in ds] == list(range(40))
        assert len(ds._open) <= 3
        assert ds.get_batch(range(40))["id"].tolist() == list(range(40))


class _Triple(Encoding):
    """A fixed-size encoding without a NumPy view: three ASCII letters."""

    name = "triple"
    size = 3

    def encode(self, value: Any) -> bytes:
        return value.encode("ascii")

    def decode_unchecked(self, data: Any) -> str:
        return str(data, "ascii")


@pytest.fixture
def triple() -> Any:
    register_encoding("triple", lambda args: _Triple())
    yield
    _REGISTRY.pop("triple")
    get_encoding.cache_clear()


@pytest.mark.usefixtures("triple")
def test_a_registered_fixed_size_encoding_without_a_vectorised_decoder(tmp_path: Path) -> None:
    with MDSWriter(tmp_path / "ds", {"t": "triple", "id": "int"}, size_limit=200) as writer:
        for i in range(30):
            writer.write({"t": f"{i:03}", "id": i})
    with LocalDataset(tmp_path / "ds") as ds:
        assert ds.num_shards > 2
        assert ds[4] == {"id": 4, "t": "004"}
        ids = [29, 0, 13, 13]
        many = ds.get_batch(ids)
        assert many["t"] == [f"{i:03}" for i in ids]
        assert many["id"].tolist() == ids
        assert ds.get_batch([1, 2])["t"] == ["001", "002"]  # one shard


def test_pickles_as_configuration(plain: Path) -> None:
    import pickle

    with LocalDataset(plain, validate_hash="sha1") as ds:
        ds[3]  # open a shard: maps and locks must not travel
        copy = pickle.loads(pickle.dumps(ds))
    assert copy.validate_hash == "sha1"
    assert copy[3]["t"] == "333"
    assert copy[3]["x"].tolist() == [3, 3, 3, 3]


def test_threads_share_a_dataset(tmp_path: Path) -> None:
    from concurrent.futures import ThreadPoolExecutor

    root = _write(tmp_path / "ds", n=200, compression="zstd", size_limit=600)
    with LocalDataset(root) as ds, ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda i: ds[i]["id"], [*range(200), *range(199, -1, -1)]))
        assert results == [*range(200), *range(199, -1, -1)]
        assert ds._decompressed_bytes == sum(held for _, held in ds._open.values())
