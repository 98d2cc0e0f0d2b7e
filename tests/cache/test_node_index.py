"""The node's binary index: built once from index.json, mapped, never trusted when corrupt or stale."""

from __future__ import annotations

import json
import multiprocessing
import os
import shutil
from pathlib import Path

import numpy as np
import pytest

from astream._cache.node_index import attach_index, binary_path
from astream._format.binindex import BinaryIndex, ShardTable
from astream._format.index import Index
from astream.errors import IndexFormatError

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
INDEXES = sorted(p.parent for p in FIXTURES.rglob("index.json") if "hostile" not in p.parts)


def _copy(src: Path, tmp_path: Path) -> str:
    dest = tmp_path / "ds"
    dest.mkdir()
    shutil.copy(src / "index.json", dest / "index.json")
    return str(dest / "index.json")


def _parquet_like(tmp_path: Path) -> str:
    """A Parquet index (per-shard source ranges, a config per shard) and a split text one."""
    shards = [
        {"column_encodings": ["int64"], "column_names": ["x"], "compression": None,
                       "format": "parquet", "hashes": [], "raw_data": {"basename": f"p{i}.mds", "bytes": 10 + i,
                       "hashes": {}}, "samples": 4 + i, "size_limit": None, "version": 2, "zip_data": None,
                       "source": {"etag": None, "file": f"part-{i}.parquet", "file_bytes": 100,
                                  "last_xxh64": "ab", "ranges": [[0, 4], [90, 96 + i]]}}
        for i in range(3)
    ]
    path = tmp_path / "pq"
    path.mkdir()
    (path / "index.json").write_text(json.dumps({"shards": shards, "version": 2}))
    return str(path / "index.json")


@pytest.mark.parametrize("folder", INDEXES, ids=[p.name for p in INDEXES])
def test_every_recorded_index_reads_back_the_same_from_its_binary_form(folder: Path, tmp_path: Path) -> None:
    index_json = _copy(folder, tmp_path)
    parsed = Index.load(index_json)
    attached = attach_index(index_json)
    assert isinstance(attached.shards, ShardTable)
    assert len(attached.shards) == len(parsed.shards)
    assert attached.shard_sizes == parsed.shard_sizes
    assert attached.num_samples == parsed.num_samples
    for a, b in zip(attached.shards, parsed.shards, strict=True):
        assert a == b
    assert attached.shards[-1] == parsed.shards[-1]


def test_parquet_source_ranges_survive(tmp_path: Path) -> None:
    index_json = _parquet_like(tmp_path)
    parsed, attached = Index.load(index_json), attach_index(index_json)
    assert [s.to_json() for s in attached.shards] == [s.to_json() for s in parsed.shards]


def test_a_second_process_maps_the_file_built_by_the_first(tmp_path: Path) -> None:
    index_json = _copy(FIXTURES / "mds" / "layouts" / "many_small_40", tmp_path)
    attach_index(index_json)
    built = os.stat(binary_path(index_json))
    again = attach_index(index_json)
    assert os.stat(binary_path(index_json)).st_ino == built.st_ino  # not rebuilt
    assert len(again.shards) == 40


def test_a_redownloaded_identical_index_keeps_its_binary_form(tmp_path: Path) -> None:
    index_json = _copy(FIXTURES / "mds" / "layouts" / "uneven_10", tmp_path)
    attach_index(index_json)
    inode = os.stat(binary_path(index_json)).st_ino
    data = Path(index_json).read_bytes()
    Path(index_json).write_bytes(data)  # same bytes, a new modification time
    os.utime(index_json, ns=(1, 1))
    attach_index(index_json)
    assert os.stat(binary_path(index_json)).st_ino == inode


def test_a_changed_index_json_is_rebuilt(tmp_path: Path) -> None:
    index_json = _copy(FIXTURES / "mds" / "layouts" / "uneven_10", tmp_path)
    before = attach_index(index_json)
    obj = json.loads(Path(index_json).read_text())
    obj["shards"] = obj["shards"][:4]
    obj["shards"][0]["samples"] += 1
    Path(index_json).write_text(json.dumps(obj))
    after = attach_index(index_json)
    assert len(after.shards) == 4
    assert after.shard_sizes[0] == before.shard_sizes[0] + 1


@pytest.mark.parametrize("damage", ["truncate", "flip", "version", "empty", "magic"])
def test_a_corrupt_binary_index_is_refused_and_then_rebuilt(tmp_path: Path, damage: str) -> None:
    index_json = _copy(FIXTURES / "mds" / "layouts" / "many_small_40", tmp_path)
    attach_index(index_json)
    path = binary_path(index_json)
    data = bytearray(Path(path).read_bytes())
    if damage == "truncate":
        data = data[: len(data) - 20]
    elif damage == "flip":
        data[len(data) // 2] ^= 0x40
    elif damage == "version":
        data[8] += 1
    elif damage == "empty":
        data = bytearray()
    else:
        data[:8] = b"NOTANIDX"
    Path(path).write_bytes(bytes(data))
    with pytest.raises(IndexFormatError, match="binary index"):
        BinaryIndex.open(path, index_json)
    rebuilt = attach_index(index_json)
    assert rebuilt.shard_sizes == Index.load(index_json).shard_sizes
    BinaryIndex.open(path, index_json).close()  # sound again


def test_a_malformed_index_json_fails_as_the_json_reader_does(tmp_path: Path) -> None:
    index_json = _copy(FIXTURES / "mds" / "layouts" / "uneven_10", tmp_path)
    obj = json.loads(Path(index_json).read_text())
    obj["shards"][3]["samples"] = -1
    Path(index_json).write_text(json.dumps(obj))
    with pytest.raises(IndexFormatError, match=r"shards\[3\]\.samples"):
        attach_index(index_json)
    Path(index_json).write_text('{"shards": [')
    with pytest.raises(IndexFormatError, match="not valid JSON"):
        attach_index(index_json)
    os.unlink(index_json)
    with pytest.raises(IndexFormatError, match=r"no index\.json"):
        attach_index(index_json)
    assert not [p for p in os.listdir(os.path.dirname(index_json)) if p.endswith(".tmp")]


def _attach_in_child(index_json: str) -> tuple[int, list[int]]:
    got = attach_index(index_json)
    return os.stat(binary_path(index_json)).st_ino, got.shard_sizes


def test_processes_starting_together_build_it_once(tmp_path: Path) -> None:
    index_json = _copy(FIXTURES / "mds" / "layouts" / "even_10x100", tmp_path)
    with multiprocessing.get_context("spawn").Pool(4) as pool:
        results = pool.map(_attach_in_child, [index_json] * 8)
    assert len({inode for inode, _ in results}) == 1
    assert all(sizes == Index.load(index_json).shard_sizes for _, sizes in results)


def test_the_columns_are_mapped_not_copied(tmp_path: Path) -> None:
    index_json = _copy(FIXTURES / "mds" / "layouts" / "even_10x100", tmp_path)
    attach_index(index_json)
    binary = BinaryIndex.open(binary_path(index_json), index_json)
    assert not binary.samples.flags.writeable
    assert not binary.samples.flags.owndata
    assert np.array_equal(binary.samples, Index.load(index_json).shard_sizes)
    binary.close()
