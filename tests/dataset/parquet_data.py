"""Parquet files for the dataset tests (written by pyarrow), and the rows pyarrow reads back."""

from __future__ import annotations

import datetime
import decimal
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

# Rows per row group of each file: two full groups and the remainder.
GROUPS = (1000, 1000, 400)
FILES = 3


def table(file: int, rows: int) -> pa.Table:
    """``rows`` rows of every supported type (nulls in the nullable ones), ids from ``file * 10_000``."""
    base = file * 10_000
    i = np.arange(rows)
    ids = base + i
    return pa.table({
        "id": pa.array(ids, pa.int64()),
        "i8": pa.array((i % 256 - 128).astype(np.int8)),
        "u16": pa.array((ids * 7 % 65536).astype(np.uint16)),
        "i32": pa.array((ids * -3).astype(np.int32)),
        "u64": pa.array(np.uint64(2**63) + ids.astype(np.uint64)),
        "f32": pa.array((ids / 3).astype(np.float32)),
        "f64": pa.array(np.where(i % 97 == 0, np.nan, ids * 1.5)),
        "flag": pa.array(i % 3 == 0),
        "s": pa.array([None if k % 7 == 0 else f"s{b}é" * (k % 4) for k, b in zip(i, ids, strict=True)]),
        "ls": pa.array([f"L{b}" for b in ids], pa.large_string()),
        "b": pa.array([None if k % 13 == 0 else bytes([k % 256]) * (k % 5) for k in i], pa.binary()),
        "fb": pa.array([int(b).to_bytes(4, "little") for b in ids], pa.binary(4)),
        "ni": pa.array([None if k % 11 == 0 else int(k) for k in i], pa.int32()),
        "nf": pa.array([None if k % 5 == 0 else float(k) / 4 for k in i], pa.float64()),
        "lst": pa.array([None if k % 17 == 0 else list(range(k % 4)) for k in i], pa.list_(pa.int16())),
        "llst": pa.array([[float(k)] * (k % 3) for k in i], pa.large_list(pa.float32())),
        "fx": pa.array([[float(k), -float(k)] for k in i], pa.list_(pa.float64(), 2)),
        "nfx": pa.array([None if k % 23 == 0 else [int(k), 1, 2] for k in i], pa.list_(pa.int32(), 3)),
        "ts": pa.array(ids.astype("datetime64[ms]")),
        "day": pa.array([datetime.date(2020, 1, 1) + datetime.timedelta(days=int(k)) for k in i], pa.date32()),
        "dec": pa.array([decimal.Decimal(int(b)) / 100 for b in ids], pa.decimal128(12, 2)),
        "st": pa.array([None if k % 19 == 0 else {"a": int(k), "t": str(k)} for k in i]),
        "cat": pa.array([["red", "green", "blue"][k % 3] for k in i]).dictionary_encode(),
    })


def write(root: Path, files: int = FILES, groups: tuple[int, ...] = GROUPS, sub: str = "") -> list[Path]:
    """Write ``files`` Parquet files of ``groups`` row groups under ``root/sub``."""
    folder = root / sub if sub else root
    folder.mkdir(parents=True, exist_ok=True)
    paths = []
    for f in range(files):
        path = folder / f"part-{f:02d}.parquet"
        whole = table(f, sum(groups))
        with pq.ParquetWriter(path, whole.schema) as writer:
            start = 0
            for rows in groups:
                writer.write_table(whole.slice(start, rows), row_group_size=rows)
                start += rows
        paths.append(path)
    return paths


def truth(paths: list[Path], columns: list[str] | None = None) -> dict[int, dict[str, Any]]:
    """id -> row as pyarrow reads it (``as_py`` values)."""
    out: dict[int, dict[str, Any]] = {}
    for path in paths:
        for row in pq.read_table(path, columns=columns if columns is None or "id" in columns else [*columns, "id"]
                                 ).to_pylist():
            out[row["id"]] = row if columns is None else {k: row[k] for k in columns}
    return out


def plain(value: Any) -> Any:
    """A value astream returned, as pyarrow's ``as_py`` gives it (NumPy to Python)."""
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, np.generic):
        return value.item()
    return value


def rows(batch: dict[str, Any]) -> list[dict[str, Any]]:
    """A batch (dict of columns) as its rows, values made plain."""
    names = list(batch)
    return [{n: plain(batch[n][k]) for n in names} for k in range(len(batch[names[0]]))]


def same(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Rows equal, NaN equal to NaN."""
    if a.keys() != b.keys():
        return False
    for k in a:
        x, y = a[k], b[k]
        if isinstance(x, float) and isinstance(y, float) and x != x and y != y:
            continue
        if x != y:
            return False
    return True
