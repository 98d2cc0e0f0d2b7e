"""Inputs listed and read through astream's storage (no engine): local folders and moto's S3."""

from __future__ import annotations

import json
import pickle
from pathlib import Path
from typing import Any

import pyarrow as pa
import pytest

from astream.convert import write_partition
from astream.convert.files import FileInputs, list_inputs
from astream.errors import ConfigError, SampleError

from .conftest import ROWS
from .convertkit import check_samples, write_parquet


def _upload(s3: Any, bucket: str, folder: Path, prefix: str) -> None:
    s3.create_bucket(Bucket=bucket)
    for f in sorted(folder.iterdir()):
        s3.put_object(Bucket=bucket, Key=f"{prefix}/{f.name}", Body=f.read_bytes())


def test_parquet_in_a_bucket_read_in_groups(s3: Any, tmp_path: Path) -> None:
    from astream import LocalDataset

    folder = write_parquet(tmp_path / "in", ROWS, files=4)
    (folder / "_SUCCESS").write_bytes(b"")  # what Spark leaves beside its Parquet: not an input
    _upload(s3, "files-pq", folder, "in")
    assert [u for u, _ in list_inputs(["s3://files-pq/in/"], "parquet")] == [
        f"s3://files-pq/in/part-{k}.parquet" for k in range(4)]
    inputs = pickle.loads(pickle.dumps(FileInputs.plan(["s3://files-pq/in"], "parquet", min_groups=2)))
    assert [len(g) for g in inputs.groups] == [2, 2]
    assert inputs.schema.field("mat").type == pa.list_(pa.list_(pa.int32(), 3), 2)  # from the footer alone
    out = str(tmp_path / "ds")
    for k in range(len(inputs.groups)):
        write_partition(inputs.batches(k), out, k, compression="zstd")
    from astream.convert import merge_index

    merge_index(out)
    check_samples(iter(LocalDataset(out)), ROWS)


def test_jsonl_takes_the_first_files_schema_and_names_a_file_that_breaks_it(s3: Any, tmp_path: Path) -> None:
    folder = tmp_path / "jsonl"
    folder.mkdir()
    (folder / "a.jsonl").write_text("".join(json.dumps({"id": i, "score": i / 2}) + "\n" for i in range(5)))
    (folder / "b.jsonl").write_text(json.dumps({"id": "seven", "score": 1.0}) + "\n")
    _upload(s3, "files-js", folder, "in")
    inputs = FileInputs.plan(["s3://files-js/in/"], "jsonl")
    assert inputs.schema == pa.schema([("id", pa.int64()), ("score", pa.float64())])
    assert inputs.groups == (("s3://files-js/in/a.jsonl", "s3://files-js/in/b.jsonl"),)
    batches = inputs.batches(0)
    assert next(batches).num_rows == 5
    with pytest.raises(SampleError, match=r"s3://files-js/in/b\.jsonl: does not fit"):
        next(batches)


def test_local_images_and_nothing_found(tmp_path: Path) -> None:
    folder = tmp_path / "imgs"
    folder.mkdir()
    for name in ("b.png", "a.jpg", "notes.txt"):
        (folder / name).write_bytes(name.encode())
    inputs = FileInputs.plan([str(folder)], "image", min_groups=2)
    rows = [r for k in range(len(inputs.groups)) for b in inputs.batches(k) for r in b.to_pylist()]
    assert [(r["path"].rsplit("/", 1)[-1], r["image"]) for r in rows] == [("a.jpg", b"a.jpg"), ("b.png", b"b.png")]
    with pytest.raises(ConfigError, match="no parquet files"):
        FileInputs.plan([str(folder)], "parquet")
