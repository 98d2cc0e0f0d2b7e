"""Data and checks shared by the conversion tests: one Parquet table with every supported type."""

from __future__ import annotations

import datetime
import os
from collections.abc import Iterable, Mapping
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from astream._format.index import INDEX_NAME, Index

EPOCH = datetime.datetime(2020, 1, 1, tzinfo=datetime.timezone.utc)


def _row(i: int) -> dict[str, Any]:
    return {
        "id": i,
        "small": (i * 7) % 30000 - 15000,
        "f32": np.float32(i) / 4,
        "f64": i / 3,
        "flag": i % 3 == 0,
        "text": f"row {i} " + "é" * (i % 5),
        "blob": bytes([i % 256]) * (1 + i % 4),
        "day": datetime.date(2020, 1, 1) + datetime.timedelta(days=i),
        "when": EPOCH + datetime.timedelta(microseconds=i * 1_000_003),
        "vec": [float(i), i + 0.5, -i, 1.0],
        "mat": [[i, i + 1, i + 2], [i + 3, i + 4, i + 5]],
        "ragged": list(range(1 + i % 4)),
        "grid": [[i / 2, 1.0]] * (2 + i % 2),
        "meta": None if i % 4 == 0 else {"k": i, "tag": str(i)},
    }


SCHEMA = pa.schema([
    ("id", pa.int64()), ("small", pa.int16()), ("f32", pa.float32()), ("f64", pa.float64()),
    ("flag", pa.bool_()), ("text", pa.string()), ("blob", pa.binary()), ("day", pa.date32()),
    ("when", pa.timestamp("us", tz="UTC")), ("vec", pa.list_(pa.float32(), 4)),
    ("mat", pa.list_(pa.list_(pa.int32(), 3), 2)), ("ragged", pa.list_(pa.int64())),
    ("grid", pa.list_(pa.list_(pa.float64()))), ("meta", pa.struct([("k", pa.int64()), ("tag", pa.string())])),
])


def table(n: int, start: int = 0) -> pa.Table:
    """``n`` rows of every supported type (ids from ``start``), nulls in the json column."""
    return pa.Table.from_pylist([_row(i) for i in range(start, start + n)], schema=SCHEMA)


def write_parquet(folder: Path, n: int, files: int = 2) -> Path:
    """``n`` rows as ``files`` Parquet files (two row groups each) in ``folder``."""
    folder.mkdir(parents=True, exist_ok=True)
    per = -(-n // files)
    for k in range(files):
        pq.write_table(table(min(per, n - k * per), k * per), folder / f"part-{k}.parquet", row_group_size=max(1, per // 2))
    return folder


def expected(i: int) -> dict[str, Any]:
    """What a reader gets back for row ``i``."""
    r = _row(i)
    return {
        "id": i, "small": r["small"], "f32": r["f32"], "f64": r["f64"], "flag": int(r["flag"]), "text": r["text"],
        "blob": r["blob"], "day": (r["day"] - datetime.date(1970, 1, 1)).days,
        "when": int((r["when"] - datetime.datetime(1970, 1, 1, tzinfo=datetime.timezone.utc)).total_seconds()) * 10**9
        + r["when"].microsecond * 1000,
        "vec": np.array(r["vec"], np.float32), "mat": np.array(r["mat"], np.int32),
        "ragged": np.array(r["ragged"], np.int64), "grid": np.array(r["grid"], np.float64), "meta": r["meta"],
    }


def check_samples(samples: Iterable[Mapping[str, Any]], n: int, skip: tuple[str, ...] = ()) -> None:
    """Every id in ``range(n)`` exactly once, each sample equal to :func:`expected` (but ``skip``)."""
    seen: dict[int, Mapping[str, Any]] = {}
    for s in samples:
        i = int(s["id"])
        assert i not in seen, f"row {i} appears twice"
        seen[i] = s
    assert sorted(seen) == list(range(n))
    for i, s in seen.items():
        want = expected(i)
        for key, value in want.items():
            if key in skip:
                continue
            got = s[key]
            if isinstance(value, np.ndarray):
                assert isinstance(got, np.ndarray), (i, key, got)
                assert got.dtype == value.dtype, (i, key, got.dtype)
                np.testing.assert_array_equal(got, value, err_msg=f"row {i} {key}")
            else:
                assert got == value, (i, key, got, value)


def local_files(root: str) -> set[str]:
    """Every file under ``root``, relative to it."""
    out = set()
    for here, _, names in os.walk(root):
        out |= {os.path.relpath(os.path.join(here, n), root) for n in names}
    return out


def check_no_orphans(files: set[str], index_bytes: bytes) -> None:
    """The files are the index, each part's index, and the shards the index lists: no more."""
    index = Index.from_bytes(index_bytes)
    shards = {s.stored.basename for s in index.shards}
    parts = {f for f in files if f.endswith("/" + INDEX_NAME)}
    assert files - parts - {INDEX_NAME} == shards, sorted(files - parts - {INDEX_NAME} - shards)
