"""Acceptance: astream reads every dataset mosaicml-streaming 0.13 wrote, exactly."""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from astream import LocalDataset

from .helpers import DATASETS, WITH_EXPECTED, Expected, dataset_root

pytest.importorskip("PIL")


@pytest.fixture(scope="module", params=WITH_EXPECTED, ids=lambda d: d["name"])
def recorded(request: pytest.FixtureRequest, mds_dir: Path) -> tuple[LocalDataset, Expected]:
    entry: dict[str, Any] = request.param
    root, split = dataset_root(mds_dir, entry)
    ds = LocalDataset(root, split=split, allow_unsafe_types=entry["allow_unsafe_types"])
    yield ds, Expected(mds_dir, entry)
    ds.close()


def test_shape_matches_manifest(recorded: tuple[LocalDataset, Expected]) -> None:
    ds, expected = recorded
    entry = expected.entry
    assert len(ds) == entry["num_samples"] == expected.num_samples
    assert ds.num_shards == entry["num_shards"]
    assert [s.samples for s in ds.index.shards] == entry["samples_per_shard"]
    assert ds.columns == {name: expected.columns[name] for name in sorted(expected.columns)}


def test_every_sample_decodes_exactly(recorded: tuple[LocalDataset, Expected]) -> None:
    ds, expected = recorded
    if expected.columnar:
        _check_columnar(ds, expected)
        return
    for i, want in enumerate(expected.samples):
        sample = ds[i]
        assert sorted(sample) == sorted(want["values"])
        for column, tagged in want["values"].items():
            expected.check(sample[column], tagged, f"{expected.entry['name']}[{i}].{column}")


def _check_columnar(ds: LocalDataset, expected: Expected) -> None:
    batch = ds.get_batch(np.arange(len(ds)))
    for name, encoding in expected.columns.items():
        want = expected.column(name)
        got = batch[name]
        if isinstance(got, np.ndarray):
            assert got.dtype == want.dtype, name
            assert np.array_equal(got, want), name
        else:
            assert got == want.tolist(), name
        for i in range(0, len(ds), 97):
            value = ds[i][name]
            kind = int if encoding == "int" else str if encoding == "str" else want.dtype.type
            assert type(value) is kind, (i, name)
            assert value == want[i], (i, name)


def test_record_bytes_match_raw_sha1(recorded: tuple[LocalDataset, Expected]) -> None:
    ds, expected = recorded
    if expected.columnar:
        pytest.skip("column-wise expected values carry no record digests")
    for i, want in enumerate(expected.samples):
        shard, offset = ds._locate(i)
        assert hashlib.sha1(ds.shard(shard).record(offset)).hexdigest() == want["raw_sha1"], i


def test_get_batch_equals_samples(recorded: tuple[LocalDataset, Expected]) -> None:
    ds, expected = recorded
    if expected.columnar:
        pytest.skip("covered column by column in test_every_sample_decodes_exactly")
    rng = np.random.default_rng(0)
    ids = [*rng.permutation(len(ds))[:64].tolist(), 0, len(ds) - 1, 0]
    batch = ds.get_batch(ids)
    for column in ds.columns:
        values = batch[column]
        assert len(values) == len(ids)
        for k, i in enumerate(ids):
            expected.check(values[k] if isinstance(values, list) else _scalar(values[k], ds.columns[column]),
                           expected.samples[i]["values"][column], f"{expected.entry['name']}[{i}].{column} (batch)")


def _scalar(value: Any, encoding: str) -> Any:
    # Batches give an int64 array for `int` columns; a single sample gives a Python int.
    return int(value) if encoding == "int" else value


@pytest.mark.parametrize("entry", [d for d in DATASETS if d["name"].startswith("layouts/")], ids=lambda d: d["name"])
def test_layout_ids_are_global_indices(entry: dict[str, Any], mds_dir: Path) -> None:
    root, split = dataset_root(mds_dir, entry)
    with LocalDataset(root, split=split, validate_hash="xxh64") as ds:
        assert len(ds) == entry["num_samples"]
        assert [s.samples for s in ds.index.shards] == entry["samples_per_shard"]
        assert ds.get_batch(np.arange(len(ds)))["id"].tolist() == list(range(len(ds)))
        assert [ds[i]["id"] for i in range(0, len(ds), 7)] == list(range(0, len(ds), 7))
        assert [s["id"] for s in ds] == list(range(len(ds)))


@pytest.mark.parametrize("entry", DATASETS, ids=lambda d: d["name"])
def test_every_recorded_hash_validates(entry: dict[str, Any], mds_dir: Path) -> None:
    root, split = dataset_root(mds_dir, entry)
    for algo in entry["writer"]["hashes"]:
        with LocalDataset(root, split=split, validate_hash=algo, allow_unsafe_types=True) as ds:
            for shard in range(ds.num_shards):
                ds.shard(shard)


def test_every_dataset_is_covered(mds_dir: Path) -> None:
    # A dataset added to the fixtures without expected values would silently go untested.
    on_disk = {p.parent.relative_to(mds_dir).as_posix() for p in mds_dir.rglob("index.json")}
    listed = {d["path"] if d["split"] is None else f"{d['path']}/{d['split']}" for d in DATASETS}
    assert on_disk == listed
