"""Dask (LocalCluster of two worker processes on 127.0.0.1): to_mds over to_delayed() partitions."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from astream import LocalDataset, StreamingDataset
from astream.convert.dask import to_mds

from .conftest import ROWS, kill_first_attempt
from .convertkit import check_no_orphans, check_samples, local_files

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::DeprecationWarning"),
              pytest.mark.filterwarnings("ignore::ResourceWarning"), pytest.mark.filterwarnings("ignore::UserWarning")]


def test_parquet_to_a_local_folder(dask_client: Any, parquet_dir: Path, tmp_path: Path) -> None:
    import dask.dataframe as dd

    ddf = dd.read_parquet(str(parquet_dir), dtype_backend="pyarrow").repartition(npartitions=3)
    out = str(tmp_path / "ds")
    fragments = to_mds(ddf, out, compression="zstd", size_limit=2000)
    assert [f.partition_id for f in fragments] == [0, 1, 2]
    check_samples(iter(LocalDataset(out)), ROWS)
    check_no_orphans(local_files(out), (tmp_path / "ds" / "index.json").read_bytes())


def _udf(pdf: Any, markers: str) -> Any:
    for n, row in enumerate(pdf.to_dict("records")):
        if n == 2:
            kill_first_attempt(markers, f"id-{row['id']}")  # the worker process dies mid-partition
        yield {"id": int(row["id"]), "text": str(row["text"])}


def test_s3_with_a_worker_killed_and_the_task_rerun(dask_client: Any, s3: Any, parquet_dir: Path, tmp_path: Path) -> None:
    import dask.dataframe as dd

    s3.create_bucket(Bucket="dask")
    markers = str(tmp_path / "markers")
    os.makedirs(markers)
    ddf = dd.read_parquet(str(parquet_dir)).repartition(npartitions=2)
    to_mds(ddf, "s3://dask/ds", {"id": "int", "text": "str"}, udf_iterable=_udf, udf_kwargs={"markers": markers},
           size_limit=300)
    assert len(os.listdir(markers)) == 2  # both partitions' first runs died
    keys = {o["Key"][3:] for o in s3.list_objects_v2(Bucket="dask")["Contents"]}
    check_no_orphans(keys, s3.get_object(Bucket="dask", Key="ds/index.json")["Body"].read())
    ds = StreamingDataset(remote="s3://dask/ds", local=str(tmp_path / "cache"), batch_size=4)
    assert sorted(int(ds[i]["id"]) for i in range(len(ds))) == list(range(ROWS))


def test_jsonl_files_read_by_dask(dask_client: Any, tmp_path: Path) -> None:
    import json

    from astream.convert.sources import read_files

    folder = tmp_path / "jsonl"
    folder.mkdir()
    for k in range(2):
        lines = [json.dumps({"id": 10 * k + i, "text": f"t{i}", "score": i / 2}) for i in range(10)]
        (folder / f"{k}.jsonl").write_text("\n".join(lines) + "\n")
    out = str(tmp_path / "ds")
    to_mds(read_files("dask", [str(folder / "0.jsonl"), str(folder / "1.jsonl")], "jsonl"), out)
    ds = LocalDataset(out)
    assert sorted(int(s["id"]) for s in ds) == list(range(20))
    assert ds.index.shards[0].column_encodings == ("int", "float64", "str")


def test_parquet_and_jsonl_in_a_bucket_to_a_bucket(dask_client: Any, s3: Any, parquet_dir: Path, tmp_path: Path) -> None:
    """Dask reads s3:// through s3fs at S3_ENDPOINT_URL (moto), and the parts go to s3:// too."""
    pytest.importorskip("s3fs", reason="the dask extra brings s3fs")
    import json

    from astream.convert.sources import read_files

    s3.create_bucket(Bucket="dask-in")
    for f in sorted(parquet_dir.glob("*.parquet")):
        s3.put_object(Bucket="dask-in", Key=f"pq/{f.name}", Body=f.read_bytes())
    lines = "".join(json.dumps({"id": i, "text": f"t{i}"}) + "\n" for i in range(7))
    s3.put_object(Bucket="dask-in", Key="js/a.jsonl", Body=lines.encode())
    s3.create_bucket(Bucket="dask-out")
    fragments = to_mds(read_files("dask", ["s3://dask-in/pq/"], "parquet"), "s3://dask-out/pq", compression="zstd",
                       size_limit=2000)
    assert len(fragments) == 2
    keys = {o["Key"][3:] for o in s3.list_objects_v2(Bucket="dask-out", Prefix="pq/")["Contents"]}
    check_no_orphans(keys, s3.get_object(Bucket="dask-out", Key="pq/index.json")["Body"].read())
    check_samples(StreamingDataset(remote="s3://dask-out/pq", local=str(tmp_path / "c1"), batch_size=4), ROWS)
    to_mds(read_files("dask", ["s3://dask-in/js/a.jsonl"], "jsonl"), "s3://dask-out/js")
    ds = StreamingDataset(remote="s3://dask-out/js", local=str(tmp_path / "c2"), batch_size=4)
    assert sorted((int(ds[i]["id"]), ds[i]["text"]) for i in range(len(ds))) == [(i, f"t{i}") for i in range(7)]
