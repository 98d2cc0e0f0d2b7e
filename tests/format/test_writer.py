"""MDSWriter: validation, shard rollover, atomic files, failure handling and the upload hooks."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from astream import LocalDataset
from astream._format.compression import get_codec
from astream._format.hashing import hash_bytes
from astream._format.writer import MDSWriter
from astream.errors import CompressionError, ConfigError, EncodingError, SampleError, UsageError

COLUMNS = {"x": "ndarray:float32:2,3", "y": "int", "name": "str"}


def _good(i: int) -> dict[str, Any]:
    return {"x": np.full((2, 3), i, np.float32), "y": i, "name": f"n{i}"}


def _index(root: Path) -> dict[str, Any]:
    result: dict[str, Any] = json.loads((root / "index.json").read_text())
    return result


@pytest.mark.parametrize(
    ("bad", "match"),
    [
        ({"x": np.zeros((2, 3), np.float32), "y": 1}, r"sample 2: missing columns \['name'\]"),
        ({**_good(0), "z": 1}, r"sample 2: .*unexpected columns \['z'\]"),
        ({**_good(0), "x": np.zeros((2, 3), np.float64)}, r"sample 2, column 'x': .*float32, not float64"),
        ({**_good(0), "x": np.zeros((3, 2), np.float32)}, r"sample 2, column 'x': .*shape \(2, 3\)"),
        ({**_good(0), "y": "7"}, r"sample 2, column 'y': .*takes an int, got str"),
        ({**_good(0), "name": None}, r"sample 2, column 'name'"),
        ({**_good(0), "y": b"short"}, r"sample 2, column 'y': .*exactly 8 bytes"),
        ([1, 2], "sample 2: a sample must be a dict"),
    ],
)
def test_bad_samples_are_refused_and_nothing_is_written(tmp_path: Path, bad: Any, match: str) -> None:
    with MDSWriter(tmp_path / "ds", COLUMNS) as writer:
        writer.write(_good(0))
        writer.write(_good(1))
        with pytest.raises(SampleError, match=match):
            writer.write(bad)
        writer.write(_good(2))
    with LocalDataset(tmp_path / "ds") as ds:
        assert [s["y"] for s in ds] == [0, 1, 2]


def _expected_shards(sizes: list[int], header: int, limit: int | None) -> list[int]:
    """Samples per shard under the rule of the format note (section 2.4)."""
    shards, count, running = [], 0, header
    for size in sizes:
        if limit and limit < running + size + 4:
            shards.append(count)
            count, running = 0, header
        count += 1
        running += size + 4
    if count:
        shards.append(count)
    return shards


@settings(max_examples=25, deadline=None)
@given(lengths=st.lists(st.integers(0, 300), max_size=40), limit=st.sampled_from([None, 0, 100, 256, 500, 2000]))
def test_rollover_follows_the_mds_rule(tmp_path_factory: pytest.TempPathFactory, lengths: list[int], limit: int | None) -> None:
    root = tmp_path_factory.mktemp("roll") / "ds"
    with MDSWriter(root, {"b": "bytes"}, size_limit=limit) as writer:
        for n in lengths:
            writer.write({"b": bytes(n)})
        header = writer._shard_overhead
    got = [s["samples"] for s in _index(root)["shards"]]
    assert got == _expected_shards([4 + n for n in lengths], header, limit)
    assert sum(got) == len(lengths)
    with LocalDataset(root) as ds:
        assert [len(s["b"]) for s in ds] == lengths


@settings(max_examples=25, deadline=None)
@given(lengths=st.lists(st.integers(0, 300), max_size=40), limit=st.sampled_from([None, 0, 100, 256, 500, 2000]),
       cut=st.integers(0, 40))
def test_records_written_in_bulk_give_the_same_shards(
    tmp_path_factory: pytest.TempPathFactory, lengths: list[int], limit: int | None, cut: int
) -> None:
    root = tmp_path_factory.mktemp("bulk")
    samples = [{"b": bytes([n % 256]) * n, "i": n} for n in lengths]
    with MDSWriter(root / "one", {"b": "bytes", "i": "int"}, size_limit=limit) as writer:
        for sample in samples:
            writer.write(sample)
    with MDSWriter(root / "bulk", {"b": "bytes", "i": "int"}, size_limit=limit) as bulk:
        records = [bulk.layout.encode(sample, k) for k, sample in enumerate(samples)]
        bulk.write_records(records[:cut])  # two calls: the second starts in a shard already begun
        bulk.write_records(iter(records[cut:]))
        assert bulk.num_samples == len(samples)
    assert sorted(os.listdir(root / "one")) == sorted(os.listdir(root / "bulk"))
    for name in os.listdir(root / "one"):
        assert (root / "one" / name).read_bytes() == (root / "bulk" / name).read_bytes(), name


def test_records_in_bulk_that_fill_a_shard_exactly(tmp_path: Path) -> None:
    # The boundary case: three records end the shard at size_limit exactly; the fourth starts the next.
    with MDSWriter(tmp_path / "probe", {"b": "bytes"}, size_limit=1000) as probe:
        header = probe._shard_overhead  # the same for every 4-digit size_limit
    limit = header + 3 * (300 + 8)  # each record: 4 bytes of length, 300 of value, 4 of offset
    assert 1000 <= limit < 10_000
    with MDSWriter(tmp_path / "ds", {"b": "bytes"}, size_limit=limit) as writer:
        writer.write_records([writer.layout.encode({"b": bytes(300)}, k) for k in range(4)])
    assert [s["samples"] for s in _index(tmp_path / "ds")["shards"]] == [3, 1]


def test_oversized_first_sample_gives_an_empty_shard(tmp_path: Path) -> None:
    with MDSWriter(tmp_path / "ds", {"b": "bytes"}, size_limit=100) as writer:
        writer.write({"b": bytes(500)})
        writer.write({"b": bytes(500)})
    assert [s["samples"] for s in _index(tmp_path / "ds")["shards"]] == [0, 1, 1]


@pytest.mark.parametrize(("limit", "stored"), [(None, None), (0, None), ("1kb", 1024), ("64mb", 1 << 26)])
def test_size_limit_forms(tmp_path: Path, limit: Any, stored: int | None) -> None:
    with MDSWriter(tmp_path / "ds", {"y": "int"}, size_limit=limit) as writer:
        writer.write({"y": 1})
    assert _index(tmp_path / "ds")["shards"][0]["size_limit"] == stored


def test_compressed_shards_keep_only_the_compressed_file(tmp_path: Path) -> None:
    root = tmp_path / "ds"
    with MDSWriter(root, COLUMNS, compression="zstd:7", hashes=["xxh64", "sha1", "sha1"], size_limit=300) as writer:
        for i in range(20):
            writer.write(_good(i))
    index = _index(root)
    assert sorted(os.listdir(root)) == ["index.json"] + [f"shard.{k:05}.mds.zstd" for k in range(len(index["shards"]))]
    for shard in index["shards"]:
        assert shard["compression"] == "zstd:7"
        assert shard["hashes"] == ["sha1", "xxh64"]
        stored = (root / shard["zip_data"]["basename"]).read_bytes()
        raw = get_codec("zstd:7").decompress(stored, size=shard["raw_data"]["bytes"])
        assert shard["zip_data"]["bytes"] == len(stored)
        assert shard["raw_data"]["bytes"] == len(raw)
        for algo in ("sha1", "xxh64"):
            assert shard["zip_data"]["hashes"][algo] == hash_bytes(algo, stored)
            assert shard["raw_data"]["hashes"][algo] == hash_bytes(algo, raw)
    with LocalDataset(root, validate_hash="sha1") as ds:
        assert [s["y"] for s in ds] == list(range(20))


def test_a_failing_with_block_leaves_no_index(tmp_path: Path) -> None:
    root = tmp_path / "ds"

    def write_then_fail() -> None:
        with MDSWriter(root, {"b": "bytes"}, size_limit=200) as writer:
            for _ in range(10):
                writer.write({"b": bytes(100)})
            raise RuntimeError("boom")

    with pytest.raises(RuntimeError, match="boom"):
        write_then_fail()
    names = os.listdir(root)
    assert "index.json" not in names
    assert names
    assert all(n.startswith("shard.") and n.endswith(".mds") for n in names)


def test_exist_ok(tmp_path: Path) -> None:
    root = tmp_path / "ds"
    root.mkdir()
    (root / "old.txt").write_text("x")
    with pytest.raises(ConfigError, match="exist_ok=True"):
        MDSWriter(root, COLUMNS)
    with MDSWriter(root, {"y": "int"}, exist_ok=True) as writer:
        writer.write({"y": 5})
    assert sorted(os.listdir(root)) == ["index.json", "shard.00000.mds"]


def test_hooks_see_each_shard_then_the_index(tmp_path: Path) -> None:
    events: list[tuple[str, Any]] = []

    class Recording(MDSWriter):
        def _after_shard(self, paths: list[str]) -> None:
            assert all(os.path.exists(p) for p in paths)
            assert not os.path.exists(os.path.join(self.local, "index.json"))
            events.append(("shard", [os.path.basename(p) for p in paths]))

        def _after_index(self, path: str) -> None:
            events.append(("index", os.path.basename(path)))

    with Recording(tmp_path / "ds", {"b": "bytes"}, compression="gz", size_limit=200) as writer:
        for _ in range(5):
            writer.write({"b": bytes(100)})
    shards = len(_index(tmp_path / "ds")["shards"])
    assert shards > 2
    assert events == [("shard", [f"shard.{k:05}.mds.gz"]) for k in range(shards)] + [("index", "index.json")]


def test_a_failed_shard_write_leaves_no_partial_file(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root = tmp_path / "ds"
    writer = MDSWriter(root, {"b": "bytes"})
    writer.write({"b": b"abc"})

    def refuse(src: str, dst: str) -> None:
        raise OSError("disk full")

    monkeypatch.setattr(os, "replace", refuse)
    with pytest.raises(OSError, match="disk full"):
        writer.finish()
    assert os.listdir(root) == []


@pytest.mark.parametrize(
    ("kwargs", "error", "match"),
    [
        ({"columns": {"a": "nope"}}, EncodingError, "column 'a'.*unknown encoding 'nope'"),
        ({"columns": {}}, ConfigError, "non-empty"),
        ({"compression": "lz4"}, CompressionError, "unknown compression 'lz4'"),
        ({"compression": "zstd:99"}, CompressionError, "1..22"),
        ({"hashes": ["md6"]}, ConfigError, "'md6' is not a known hash"),
        ({"hashes": "sha1"}, ConfigError, "list"),
        ({"size_limit": 1 << 32}, ConfigError, "4 GiB"),
        ({"size_limit": "lots"}, ConfigError, "not a size"),
        ({"out": "s3://bucket/ds"}, ConfigError, "local directories"),
    ],
)
def test_bad_settings(tmp_path: Path, kwargs: dict[str, Any], error: type[Exception], match: str) -> None:
    args = {"out": tmp_path / "ds", "columns": COLUMNS, **kwargs}
    with pytest.raises(error, match=match):
        MDSWriter(**args)


def test_finish_is_idempotent_and_final(tmp_path: Path) -> None:
    writer = MDSWriter(tmp_path / "ds", {"y": "int"})
    writer.write({"y": 1})
    writer.finish()
    writer.finish()
    assert writer.num_samples == 1
    assert len(writer.shards) == 1
    with pytest.raises(UsageError, match="finished"):
        writer.write({"y": 2})


def test_empty_dataset_has_an_index_without_shards(tmp_path: Path) -> None:
    with MDSWriter(tmp_path / "ds", {"y": "int"}):
        pass
    assert _index(tmp_path / "ds") == {"shards": [], "version": 2}
    with LocalDataset(tmp_path / "ds") as ds:
        assert len(ds) == 0
        assert ds.columns == {}
        assert ds.get_batch([]) == {}


def test_forgotten_writer_warns(tmp_path: Path) -> None:
    writer = MDSWriter(tmp_path / "ds", {"y": "int"})
    writer.write({"y": 1})
    with pytest.warns(ResourceWarning, match="never finished"):
        writer.__del__()
    writer.abort()
