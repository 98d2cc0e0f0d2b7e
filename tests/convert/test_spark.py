"""Spark (local[2,2], loopback only): dataframe_to_mds as MosaicML documents it, with astream's import."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from astream import LocalDataset, StreamingDataset
from astream.convert import dataframe_to_mds
from astream.errors import ConfigError

from .conftest import ROWS, kill_first_attempt
from .convertkit import check_no_orphans, check_samples, local_files

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::DeprecationWarning"),
              pytest.mark.filterwarnings("ignore:PySpark does not yet fully support pandas:FutureWarning"),
              pytest.mark.filterwarnings("ignore::ResourceWarning")]


def test_parquet_to_a_local_folder(spark: Any, parquet_dir: Path, tmp_path: Path) -> None:
    df = spark.read.parquet(str(parquet_dir)).repartition(3)
    out = str(tmp_path / "ds")
    mds_path = dataframe_to_mds(df, merge_index=True, mds_kwargs={"out": out, "compression": "zstd", "size_limit": 2000})
    assert mds_path == (out, "")
    ds = LocalDataset(out)
    assert ds.index.shards[0].column_encodings[ds.index.shards[0].column_names.index("mat")] == "ndarray:int32"
    check_samples(iter(ds), ROWS)
    check_no_orphans(local_files(out), (tmp_path / "ds" / "index.json").read_bytes())


def test_parquet_to_s3_with_a_task_killed_and_retried(spark: Any, s3: Any, parquet_dir: Path, tmp_path: Path) -> None:
    s3.create_bucket(Bucket="spark")
    markers = str(tmp_path / "markers")
    os.makedirs(markers)

    def udf(pdf: Any, markers: str) -> Any:
        for n, row in enumerate(pdf.to_dict("records")):
            if n == 3 and int(row["id"]) % 2 == 0:
                kill_first_attempt(markers, f"id-{row['id']}")  # dies halfway through its partition
            yield {"id": int(row["id"]), "text": row["text"]}

    dataframe_to_mds(spark.read.parquet(str(parquet_dir)).repartition(2), merge_index=True,
                     mds_kwargs={"out": "s3://spark/ds", "columns": {"id": "int", "text": "str"}, "size_limit": 300},
                     udf_iterable=udf, udf_kwargs={"markers": markers})
    assert os.listdir(markers)  # a task did die
    keys = {o["Key"][3:] for o in s3.list_objects_v2(Bucket="spark")["Contents"]}
    check_no_orphans(keys, s3.get_object(Bucket="spark", Key="ds/index.json")["Body"].read())
    ds = StreamingDataset(remote="s3://spark/ds", local=str(tmp_path / "cache"), batch_size=4)
    ids = sorted(int(ds[i]["id"]) for i in range(len(ds)))
    assert ids == list(range(ROWS))


def test_mosaicml_doc_examples_run_with_only_the_import_changed(spark: Any, tmp_path: Path) -> None:
    # The examples of MosaicML's "Spark DataFrame to MDS" guide, their import swapped.
    from pyspark.sql.types import IntegerType, StringType, StructField, StructType

    data = [(i, f"name {i}", i % 7) for i in range(20)]
    schema = StructType([StructField("id", IntegerType()), StructField("name", StringType()),
                         StructField("amount", IntegerType())])
    df = spark.createDataFrame(data=data, schema=schema).repartition(4)
    out_path = str(tmp_path / "mds")
    mds_kwargs = {"out": out_path, "columns": {"id": "int32", "name": "str", "amount": "int32"},
                  "keep_local": True, "compression": "zstd:7", "hashes": ["sha1", "xxh64"], "size_limit": 1 << 26}
    dataframe_to_mds(df.repartition(4), merge_index=True, mds_kwargs=mds_kwargs)
    assert sorted(int(s["id"]) for s in LocalDataset(out_path)) == list(range(20))

    def udf_iterable(pdf: Any) -> Any:
        for _, row in pdf.iterrows():
            yield {"id": int(row["id"]), "name_upper": row["name"].upper()}

    out2 = str(tmp_path / "mds2")
    dataframe_to_mds(df, merge_index=True, udf_iterable=udf_iterable,
                     mds_kwargs={"out": out2, "columns": {"id": "int", "name_upper": "str"}})
    assert sorted(s["name_upper"] for s in LocalDataset(out2))[0] == "NAME 0"
    with pytest.raises(ConfigError, match="udf_iterable, mds_kwargs must give 'columns'"):
        dataframe_to_mds(df, udf_iterable=udf_iterable, mds_kwargs={"out": out2})
    from pyspark.sql.types import DayTimeIntervalType

    bad = spark.createDataFrame([(1,)], "x int").selectExpr("x", "INTERVAL '1' DAY AS gap")
    assert isinstance(bad.schema["gap"].dataType, DayTimeIntervalType)
    with pytest.raises(ConfigError, match="column 'gap'"):
        dataframe_to_mds(bad, mds_kwargs={"out": str(tmp_path / "bad")})


def test_jsonl_files_read_by_spark(spark: Any, tmp_path: Path) -> None:
    import json

    from astream.convert.sources import read_files

    folder = tmp_path / "jsonl"
    folder.mkdir()
    (folder / "a.jsonl").write_text("".join(json.dumps({"id": i, "tags": ["x"] * (i % 3)}) + "\n" for i in range(12)))
    out = str(tmp_path / "ds")
    dataframe_to_mds(read_files("spark", [str(folder)], "jsonl", spark).repartition(2), mds_kwargs={"out": out})
    ds = LocalDataset(out)
    assert sorted((int(s["id"]), tuple(s["tags"])) for s in ds) == [(i, ("x",) * (i % 3)) for i in range(12)]


def test_mosaicml_nested_array_example(spark: Any, tmp_path: Path) -> None:
    # MosaicML's nested-array example (2-D float arrays through a udf), its import swapped; and
    # the same frame without the udf, which MosaicML refuses and astream infers.
    import numpy as np
    from pyspark.sql.types import ArrayType, FloatType, IntegerType, StructField, StructType

    schema = StructType([
        StructField("nested_float_array_1", ArrayType(ArrayType(FloatType())), True),
        StructField("nested_float_array_2", ArrayType(ArrayType(FloatType())), True),
        StructField("integer_array", ArrayType(IntegerType()), True),
    ])
    data = [([[1.1, 2.2], [3.3, 4.4]], [[5.5, 6.6], [7.7, 8.8]], [1, 2, 3]),
            ([[9.9, 10.1], [11.2, 12.3]], [[13.4, 14.5], [15.6, 16.7]], [4, 5, 6])]
    df = spark.createDataFrame(data, schema)
    mds_kwargs = {"out": str(tmp_path / "jsontest"), "keep_local": True,
                  "columns": {"array_1": "ndarray:float32", "array_2": "ndarray:float32",
                              "integer_array": "ndarray:int32"}}

    def udf_iterable(frame: Any) -> Any:
        for sample in frame.to_dict("records"):
            yield {"array_1": np.vstack(sample["nested_float_array_1"]).astype(np.float32),
                   "array_2": np.vstack(sample["nested_float_array_2"]).astype(np.float32),
                   "integer_array": sample["integer_array"]}

    _ = dataframe_to_mds(df.repartition(4), merge_index=True, mds_kwargs=mds_kwargs, udf_iterable=udf_iterable)
    rows = sorted(LocalDataset(str(tmp_path / "jsontest")), key=lambda s: int(s["integer_array"][0]))
    assert [r["array_1"].shape for r in rows] == [(2, 2), (2, 2)]
    np.testing.assert_array_equal(rows[1]["array_2"], np.array([[13.4, 14.5], [15.6, 16.7]], np.float32))
    dataframe_to_mds(df.repartition(4), mds_kwargs={"out": str(tmp_path / "direct")})
    direct = sorted(LocalDataset(str(tmp_path / "direct")), key=lambda s: int(s["integer_array"][0]))
    for a, b in zip(rows, direct, strict=True):
        np.testing.assert_array_equal(a["array_1"], b["nested_float_array_1"])
        np.testing.assert_array_equal(a["integer_array"], b["integer_array"])


def test_bucket_inputs_read_by_the_tasks_through_astream_storage(spark: Any, s3: Any, tmp_path: Path) -> None:
    """No s3a:// connector: the CLI lists the bucket and each task downloads its files itself."""
    from astream.cli import main
    from astream.convert.spark import files_to_mds

    from .convertkit import write_parquet

    folder = write_parquet(tmp_path / "in", ROWS, files=3)
    s3.create_bucket(Bucket="spark-in")
    for f in sorted(folder.iterdir()):
        s3.put_object(Bucket="spark-in", Key=f"pq/{f.name}", Body=f.read_bytes())
    s3.put_object(Bucket="spark-in", Key="img/a.png", Body=b"png-a")
    s3.put_object(Bucket="spark-in", Key="img/b.jpg", Body=b"jpg-b")
    s3.create_bucket(Bucket="spark-out")
    assert main(["convert", "s3://spark-in/pq/", "-o", "s3://spark-out/ds", "--engine", "spark", "--parts", "2",
                 "--compression", "zstd", "--size-limit", "4kb", "-q"]) == 0
    keys = {o["Key"][3:] for o in s3.list_objects_v2(Bucket="spark-out", Prefix="ds/")["Contents"]}
    assert {k.split("/")[0] for k in keys} == {"index.json", "part-00000", "part-00001"}
    check_no_orphans(keys, s3.get_object(Bucket="spark-out", Key="ds/index.json")["Body"].read())
    check_samples(StreamingDataset(remote="s3://spark-out/ds", local=str(tmp_path / "cache"), batch_size=4), ROWS)
    out = str(tmp_path / "img")
    files_to_mds(spark, ["s3://spark-in/img"], "image", {"out": out})
    assert sorted((s["path"], s["image"]) for s in LocalDataset(out)) == [
        ("s3://spark-in/img/a.png", b"png-a"), ("s3://spark-in/img/b.jpg", b"jpg-b")]


def test_mosaicml_return_value_default_compression_and_a_map_of_bytes(spark: Any, tmp_path: Path) -> None:
    import json

    df = spark.createDataFrame([(i, f"t{i}") for i in range(10)], "id int, text string").repartition(2)
    out = str(tmp_path / "ds")
    assert dataframe_to_mds(df, mds_kwargs={"out": out}) == (out, "")  # MosaicML's mds_path
    shards = json.loads((tmp_path / "ds" / "index.json").read_text())["shards"]
    assert {s["compression"] for s in shards} == {"zstd"}  # MosaicML's default without the key
    plain = str(tmp_path / "plain")
    dataframe_to_mds(df, mds_kwargs={"out": plain, "compression": None})
    assert {s["compression"] for s in json.loads((tmp_path / "plain" / "index.json").read_text())["shards"]} == {None}
    assert sorted(int(s["id"]) for s in LocalDataset(out)) == list(range(10))

    # A map of bytes has no JSON form: refused on the driver, naming the column, before any task.
    bad = spark.createDataFrame([(1, {"k": bytearray(b"v")})], "id int, m map<string,binary>")
    context = spark.sparkContext
    context.setJobGroup("map-of-bytes", "dataframe_to_mds of an unstorable column")
    try:
        with pytest.raises(ConfigError, match=r"column 'm' has Arrow type map<string, binary>.*no binary"):
            dataframe_to_mds(bad, mds_kwargs={"out": str(tmp_path / "bad")})
        with pytest.raises(ConfigError, match=r"column 'm' .* not all JSON-serialisable"):
            dataframe_to_mds(bad, mds_kwargs={"out": str(tmp_path / "bad"), "columns": {"id": "int", "m": "json"}})
    finally:
        context.setLocalProperty("spark.jobGroup.id", None)
    assert context.statusTracker().getJobIdsForGroup("map-of-bytes") == []
    assert not (tmp_path / "bad").exists()
