"""Property: any columns, any samples — written, then read back by get and get_batch, unchanged."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from astream import LocalDataset, MDSWriter

from .strategies import same, values_for

# Cheap encodings (no images): enough to mix fixed and variable columns in every order.
ENCODINGS = [
    "bytes", "str", "int", "uint8", "int16", "float32", "float64", "str_int", "json",
    "ndarray", "ndarray:int32", "ndarray:uint8:3", "ndarray:float16:2,2",
]


@st.composite
def datasets(draw: st.DrawFn) -> tuple[dict[str, str], list[dict[str, Any]], int | None]:
    names = draw(st.lists(st.text("abcxyz_", min_size=1, max_size=4), min_size=1, max_size=4, unique=True))
    columns = {name: draw(st.sampled_from(ENCODINGS)) for name in names}
    samples = draw(st.lists(st.fixed_dictionaries({n: values_for(e) for n, e in columns.items()}), max_size=12))
    limit = draw(st.sampled_from([None, 300, 1000]))
    return columns, samples, limit


@settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])
@given(data=datasets(), ids=st.lists(st.integers(0, 1000), max_size=16))
def test_written_samples_read_back_unchanged(
    tmp_path_factory: pytest.TempPathFactory, data: tuple[dict[str, str], list[dict[str, Any]], int | None], ids: list[int]
) -> None:
    columns, samples, limit = data
    root = tmp_path_factory.mktemp("rt") / "ds"
    with MDSWriter(root, columns, size_limit=limit, hashes=["xxh3_64"]) as writer:
        for sample in samples:
            writer.write(sample)
    with LocalDataset(root, validate_hash="xxh3_64") as ds:
        assert len(ds) == len(samples)
        for i, sample in enumerate(samples):
            read = ds[i]
            for name, encoding in columns.items():
                assert same(encoding, sample[name], read[name]), (i, name)
        if not samples:
            return
        picked = [i % len(samples) for i in ids]
        batch = ds.get_batch(picked)
        for name, encoding in columns.items():
            assert len(batch[name]) == len(picked)
            for k, i in enumerate(picked):
                value = batch[name][k]
                if encoding == "int":
                    value = int(value)
                elif isinstance(batch[name], np.ndarray) and encoding.startswith("ndarray"):
                    assert value.shape == ds[i][name].shape
                assert same(encoding, samples[i][name], value), (k, name)


def test_columns_are_stored_in_sorted_order(tmp_path: Path) -> None:
    with MDSWriter(tmp_path / "ds", {"b": "int", "a": "str", "C": "bytes"}) as writer:
        writer.write({"b": 1, "a": "x", "C": b"y"})
    with LocalDataset(tmp_path / "ds") as ds:
        assert list(ds.columns) == ["C", "a", "b"]
        assert ds[0] == {"C": b"y", "a": "x", "b": 1}
