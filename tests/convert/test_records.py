"""The bulk path (Arrow columns -> records) makes the bytes the per-sample encoder makes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from astream._format.record import RecordLayout
from astream.convert import write_partition
from astream.convert._records import batch_records
from astream.convert._types import arrow_columns, batch_samples

from .convertkit import table


def _plain(n: int) -> pa.Table:
    rng = np.random.default_rng(3)
    return pa.table({
        "id": pa.array(np.arange(n), pa.int64()),
        "small": pa.array(rng.integers(-100, 100, n), pa.int16()),
        "narrow": pa.array(rng.integers(0, 200, n), pa.uint8()),
        "f32": pa.array(rng.standard_normal(n), pa.float32()),
        "flag": pa.array(rng.integers(0, 2, n) == 1),
        "text": pa.array([f"row {i} " + "é" * (i % 5) for i in range(n)]),
        "big": pa.array([f"{i}" * (i % 7) for i in range(n)], pa.large_string()),
        "blob": pa.array([bytes([i % 256]) * (i % 4) for i in range(n)], pa.binary()),
        "mat": pa.FixedSizeListArray.from_arrays(
            pa.FixedSizeListArray.from_arrays(pa.array(np.arange(n * 6, dtype=np.int32)), 3), 2),
    })


@pytest.mark.parametrize("overrides", [{}, {"small": "int64", "narrow": "int", "f32": "float64", "flag": "int32"}])
def test_the_records_are_the_per_sample_encoders_bytes(overrides: dict[str, str]) -> None:
    data = _plain(50)
    columns = arrow_columns(data.schema, overrides)
    layout = RecordLayout.from_columns(columns)
    for batch in (data.to_batches()[0], data.to_batches()[0].slice(7, 30)):  # a slice: buffers start at an offset
        records = batch_records(pa, batch, layout)
        assert records is not None
        assert records == [layout.encode(s, i) for i, s in enumerate(batch_samples(batch, columns))]


@pytest.mark.parametrize(("column", "encoding"), [
    ("day", None), ("when", None), ("ragged", None), ("meta", None), ("f64", "float32"), ("id", "int32"),
    ("blob", "str"),
])
def test_other_columns_take_the_per_sample_path(column: str, encoding: str | None) -> None:
    # Dates, variable arrays, json, narrowing casts (checked per value) and re-typed bytes.
    data = table(4).select([column])
    layout = RecordLayout.from_columns(arrow_columns(data.schema, {column: encoding} if encoding else None))
    assert batch_records(pa, data.to_batches()[0], layout) is None


def test_write_partition_writes_the_same_shards_either_way(tmp_path: Path) -> None:
    data = _plain(300)
    columns = arrow_columns(data.schema)
    write_partition(data.to_batches(max_chunksize=64), str(tmp_path / "bulk"), 0, compression="zstd",
                    size_limit=4000, hashes=["xxh64"])
    rows = list(batch_samples(data, columns))
    write_partition(rows, str(tmp_path / "samples"), 0, columns, compression="zstd", size_limit=4000,
                    hashes=["xxh64"])
    bulk = sorted(p.relative_to(tmp_path / "bulk") for p in (tmp_path / "bulk").rglob("*") if p.is_file())
    assert len(bulk) > 5
    for name in bulk:
        assert (tmp_path / "bulk" / name).read_bytes() == (tmp_path / "samples" / name).read_bytes(), name
