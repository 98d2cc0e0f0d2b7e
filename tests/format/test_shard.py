"""ShardReader: bad shards are rejected (at open, or a chunk of heads at a time), hostile bytes never escape as foreign errors."""

from __future__ import annotations

import json
import shutil
import struct
from decimal import Decimal
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from astream import LocalDataset, MDSWriter
from astream._format.index import Index
from astream._format.record import RecordLayout
from astream._format.shard import _HEAD_CHUNK, ShardReader
from astream.errors import (
    AstreamError,
    EncodingError,
    HashMismatchError,
    SampleIndexError,
    ShardFormatError,
)

COLUMNS = {
    "id": "int", "f": "float32", "s": "str", "b": "bytes", "j": "json", "a": "ndarray",
    "fixed": "ndarray:uint16:3", "big": "str_int", "dec": "str_decimal",
}
FIXED = {"id": "int", "f": "float32", "fixed": "ndarray:uint16:3"}


def _sample(i: int, columns: dict[str, str]) -> dict[str, Any]:
    full = {
        "id": i, "f": i / 3, "s": "é" * (i % 5), "b": bytes(range(i % 7)), "j": {"i": i, "l": [i] * (i % 3)},
        "a": np.arange(1 + i % 4, dtype=np.int32).reshape(-1, 1), "fixed": np.array([i, i + 1, i + 2], np.uint16),
        "big": 10**20 + i, "dec": Decimal(i) / 4,
    }
    return {k: full[k] for k in columns}


def _write(path: Path, columns: dict[str, str], n: int, **kwargs: Any) -> Path:
    with MDSWriter(path, columns, **kwargs) as writer:
        for i in range(n):
            writer.write(_sample(i, columns))
    return path


@pytest.fixture(scope="module")
def shard_bytes(tmp_path_factory: pytest.TempPathFactory) -> tuple[bytes, RecordLayout]:
    root = _write(tmp_path_factory.mktemp("shard") / "ds", COLUMNS, 12, size_limit=None)
    info = Index.load(root / "index.json").shards[0]
    return (root / "shard.00000.mds").read_bytes(), RecordLayout.from_shard(info, "index.json")


def _reader(data: bytes, layout: RecordLayout, expected: int | None = 12) -> ShardReader:
    return ShardReader(data, layout, name="shard.00000.mds", shard=0, expected_samples=expected)


def _offsets(data: bytes) -> list[int]:
    (n,) = struct.unpack_from("<I", data)
    return list(struct.unpack_from(f"<{n + 1}I", data, 4))


def _with_offsets(data: bytes, offsets: list[int]) -> bytes:
    return data[:4] + struct.pack(f"<{len(offsets)}I", *offsets) + data[4 + 4 * len(offsets) :]


def test_reads_every_sample(shard_bytes: tuple[bytes, RecordLayout]) -> None:
    data, layout = shard_bytes
    with _reader(data, layout) as reader:
        assert len(reader) == 12
        for i in range(12):
            sample = reader.get(i)
            assert sample["id"] == i
            assert sample["j"] == {"i": i, "l": [i] * (i % 3)}
        assert reader.get(-1)["id"] == 11
        batch = reader.get_batch([5, 0, 5, -1])
        assert batch["id"].tolist() == [5, 0, 5, 11]
        assert batch["fixed"].shape == (4, 3)
        assert batch["fixed"][1].tolist() == [0, 1, 2]
        assert batch["s"] == ["", "", "", "é"]
        assert [a.tolist() for a in batch["a"]] == [reader.get(i)["a"].tolist() for i in (5, 0, 5, 11)]
        assert batch["f"].dtype == np.float32
        assert batch["f"][0] == np.float32(5 / 3)


def test_all_fixed_shard_uses_one_strided_view(tmp_path: Path) -> None:
    root = _write(tmp_path / "ds", FIXED, 50, size_limit=None)
    info = Index.load(root / "index.json").shards[0]
    with ShardReader.open(root / info.raw_data.basename, RecordLayout.from_shard(info, "index.json")) as reader:
        assert reader._region is not None
        ids = [49, 3, 3, 0]
        batch = reader.get_batch(ids)
        assert batch["id"].tolist() == ids
        assert batch["fixed"].tolist() == [[i, i + 1, i + 2] for i in ids]
        assert batch["f"].tolist() == [np.float32(i / 3) for i in ids]
        assert batch["fixed"].flags.writeable
        assert reader.get_batch([])["fixed"].shape == (0, 3)


def test_zero_sample_shard(tmp_path: Path) -> None:
    root = _write(tmp_path / "ds", {"id": "int", "s": "str"}, 3, size_limit=10)  # every shard overflows
    index = Index.load(root / "index.json")
    assert index.shards[0].samples == 0
    info = index.shards[0]
    with ShardReader.open(root / info.raw_data.basename, RecordLayout.from_shard(info, "x"), expected_samples=0) as reader:
        assert len(reader) == 0
        empty = reader.get_batch([])
        assert empty["s"] == []
        assert empty["id"].shape == (0,)
        with pytest.raises(SampleIndexError, match="out of range"):
            reader.get(0)


@pytest.mark.parametrize("cut", [0, 3, 10, 30, 200, -1])
def test_truncated_shard(shard_bytes: tuple[bytes, RecordLayout], cut: int) -> None:
    data, layout = shard_bytes
    with pytest.raises(ShardFormatError, match=r"shard\.00000\.mds \(shard 0\)"):
        _reader(data[:cut], layout)


def test_offsets_past_the_end(shard_bytes: tuple[bytes, RecordLayout]) -> None:
    data, layout = shard_bytes
    offsets = _offsets(data)
    offsets[-1] += 100
    with pytest.raises(ShardFormatError, match=r"sample 11.*past the end"):
        _reader(_with_offsets(data, offsets), layout)


def test_offsets_going_backwards(shard_bytes: tuple[bytes, RecordLayout]) -> None:
    data, layout = shard_bytes
    offsets = _offsets(data)
    offsets[4], offsets[5] = offsets[5], offsets[4]
    with pytest.raises(ShardFormatError, match=r"sample [34].*backwards"):
        _reader(_with_offsets(data, offsets), layout)


def test_first_offset_inside_the_header(shard_bytes: tuple[bytes, RecordLayout]) -> None:
    data, layout = shard_bytes
    offsets = _offsets(data)
    offsets[0] = 8
    with pytest.raises(ShardFormatError, match="sample 0"):
        _reader(_with_offsets(data, offsets), layout)


def test_count_disagreeing_with_index(shard_bytes: tuple[bytes, RecordLayout]) -> None:
    data, layout = shard_bytes
    with pytest.raises(ShardFormatError, match=r"holds 12 samples but index\.json says 13"):
        _reader(data, layout, expected=13)


def test_head_disagreeing_with_offsets(shard_bytes: tuple[bytes, RecordLayout]) -> None:
    data, layout = shard_bytes
    begin = _offsets(data)[7]
    head = struct.unpack_from("<I", data, begin)[0]
    broken = data[:begin] + struct.pack("<I", head + 1) + data[begin + 4 :]
    with pytest.raises(ShardFormatError, match=r"sample 7.*head"):
        _reader(broken, layout)


def test_heads_of_a_big_shard_are_checked_a_chunk_at_a_time(tmp_path: Path) -> None:
    """A bad head past the first chunk is caught when its chunk is first read, by get and get_batch."""
    columns = {"id": "int", "s": "str"}
    n = 3 * _HEAD_CHUNK
    root = _write(tmp_path / "ds", {"id": "int", "s": "str"}, n, size_limit=None)
    info = Index.load(root / "index.json").shards[0]
    layout = RecordLayout.from_shard(info, "index.json")
    data = (root / "shard.00000.mds").read_bytes()
    bad = 2 * _HEAD_CHUNK + 5
    begin = _offsets(data)[bad]
    head = struct.unpack_from("<I", data, begin)[0]
    broken = data[:begin] + struct.pack("<I", head + 1) + data[begin + 4 :]
    with ShardReader(broken, layout, name="shard.00000.mds", expected_samples=n) as reader:  # opens
        assert reader.get(7) == _sample(7, columns)
        assert reader.get_batch([1, _HEAD_CHUNK + 1])["id"].tolist() == [1, _HEAD_CHUNK + 1]
        with pytest.raises(ShardFormatError, match=rf"sample {bad}.*head"):
            reader.get(2 * _HEAD_CHUNK)  # the same chunk as the bad record
        with pytest.raises(ShardFormatError, match=rf"sample {bad}.*head"):
            reader.get_batch([0, n - 1])
    with ShardReader(data, layout, name="shard.00000.mds", expected_samples=n) as reader:
        ids = np.random.default_rng(0).permutation(n)[:500]
        assert reader.get_batch(ids)["s"] == [_sample(int(i), columns)["s"] for i in ids]


def test_undecodable_value_names_sample_and_column(shard_bytes: tuple[bytes, RecordLayout]) -> None:
    data, layout = shard_bytes
    begin = _offsets(data)[2]
    spans = layout.split(data, begin)
    start, _ = spans[layout.names.index("j")]
    broken = data[:start] + b"\xff" + data[start + 1 :]
    with _reader(broken, layout) as reader:
        with pytest.raises(EncodingError, match=r"sample 2, column 'j'.*json"):
            reader.get(2)
        with pytest.raises(EncodingError, match=r"sample 2, column 'j'"):
            reader.get_batch([1, 2])
        assert reader.get(1)["id"] == 1


def test_out_of_range(shard_bytes: tuple[bytes, RecordLayout]) -> None:
    data, layout = shard_bytes
    with _reader(data, layout) as reader:
        for bad in (12, -13):
            with pytest.raises(SampleIndexError, match="out of range"):
                reader.get(bad)
        with pytest.raises(IndexError, match="out of range"):
            reader.get_batch([0, 12])


def test_empty_file(tmp_path: Path, shard_bytes: tuple[bytes, RecordLayout]) -> None:
    (tmp_path / "empty.mds").write_bytes(b"")
    with pytest.raises(ShardFormatError, match="empty"):
        ShardReader.open(tmp_path / "empty.mds", shard_bytes[1])
    with pytest.raises(ShardFormatError, match="cannot open"):
        ShardReader.open(tmp_path / "missing.mds", shard_bytes[1])


# --- fuzzing ----------------------------------------------------------------------------

mutations = st.lists(st.tuples(st.integers(0, 10**6), st.integers(0, 255)), min_size=1, max_size=4)


def _mutate(data: bytes, changes: list[tuple[int, int]], cut: int | None) -> bytes:
    buf = bytearray(data)
    for pos, value in changes:
        buf[pos % len(buf)] = value
    return bytes(buf[:cut]) if cut is not None else bytes(buf)


def _read_everything(reader: ShardReader) -> list[dict[str, Any]]:
    out = [reader.get(i) for i in range(len(reader))]
    reader.get_batch(list(range(len(reader)))[::-1])
    return out


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(changes=mutations, cut=st.none() | st.integers(0, 2000))
def test_mutated_shards_raise_only_astream_errors(
    shard_bytes: tuple[bytes, RecordLayout], changes: list[tuple[int, int]], cut: int | None
) -> None:
    data, layout = shard_bytes
    try:
        with _reader(_mutate(data, changes, cut), layout, expected=None) as reader:
            _read_everything(reader)
    except AstreamError:
        pass


@settings(max_examples=60, deadline=None)
@given(changes=mutations, noise=st.binary(max_size=200))
def test_random_shards_raise_only_astream_errors(changes: list[tuple[int, int]], noise: bytes) -> None:
    layout = RecordLayout.from_columns(COLUMNS)
    data = struct.pack("<II", 1, 12) + noise
    try:
        with _reader(_mutate(data, changes, None), layout, expected=None) as reader:
            _read_everything(reader)
    except AstreamError:
        pass


@pytest.fixture(scope="module")
def hashed_dataset(tmp_path_factory: pytest.TempPathFactory) -> Path:
    columns = {**COLUMNS, "p": "pkl"}
    root = tmp_path_factory.mktemp("hashed") / "ds"
    with MDSWriter(root, columns, hashes=["xxh64"], size_limit=None) as writer:
        for i in range(8):
            writer.write({**_sample(i, COLUMNS), "p": {"i": i}})
    return root


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(changes=mutations)
def test_with_a_hash_a_mutated_shard_never_yields_a_wrong_sample(
    hashed_dataset: Path, tmp_path_factory: pytest.TempPathFactory, changes: list[tuple[int, int]]
) -> None:
    copy = tmp_path_factory.mktemp("mutated") / "ds"
    shutil.copytree(hashed_dataset, copy)
    original = (hashed_dataset / "shard.00000.mds").read_bytes()
    mutated = _mutate(original, changes, None)
    (copy / "shard.00000.mds").write_bytes(mutated)
    if mutated != original:
        with pytest.raises(HashMismatchError, match=r"shard\.00000\.mds"), LocalDataset(
            copy, validate_hash="xxh64", allow_unsafe_types=True
        ) as ds:
            ds[0]
        return
    with LocalDataset(copy, validate_hash="xxh64", allow_unsafe_types=True) as ds:
        assert [s["p"] for s in ds] == [{"i": i} for i in range(8)]


def test_shard_info_in_index_is_what_the_writer_wrote(hashed_dataset: Path) -> None:
    index = json.loads((hashed_dataset / "index.json").read_text())
    assert index["shards"][0]["samples"] == 8


@pytest.fixture(scope="module", params=["zstd", "gz", "snappy"])
def compressed_dataset(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _write(tmp_path_factory.mktemp("zipped") / "ds", COLUMNS, 8, size_limit=None, compression=request.param)


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(changes=mutations, cut=st.none() | st.integers(0, 400))
def test_mutated_compressed_shards_raise_only_astream_errors(
    compressed_dataset: Path, tmp_path_factory: pytest.TempPathFactory, changes: list[tuple[int, int]], cut: int | None
) -> None:
    copy = Path(shutil.copytree(compressed_dataset, tmp_path_factory.mktemp("zmut") / "ds"))
    (stored,) = copy.glob("shard.00000.mds.*")
    stored.write_bytes(_mutate(stored.read_bytes(), changes, cut))
    try:
        with LocalDataset(copy) as ds:
            [ds[i] for i in range(len(ds))]
            ds.get_batch(list(range(len(ds))))
    except AstreamError:
        pass
