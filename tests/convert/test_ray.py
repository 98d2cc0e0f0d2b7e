"""Ray Data (two CPUs, services on 127.0.0.1): ds.write_datasink(MDSDatasink(...))."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import pytest

from astream import LocalDataset, StreamingDataset
from astream.errors import ConfigError

from .conftest import ROWS, kill_first_attempt
from .convertkit import check_no_orphans, check_samples, local_files

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::DeprecationWarning"),
              pytest.mark.filterwarnings("ignore::ResourceWarning"), pytest.mark.filterwarnings("ignore::UserWarning"),
              pytest.mark.filterwarnings("ignore::FutureWarning")]


def test_parquet_to_a_local_folder(ray_session: Any, parquet_dir: Path, tmp_path: Path) -> None:
    import ray.data

    from astream.convert import MDSDatasink

    out = str(tmp_path / "ds")
    sink = MDSDatasink(out, compression="zstd", size_limit=2000)
    ray.data.read_parquet(str(parquet_dir)).repartition(3).write_datasink(sink)
    assert [f.partition_id for f in sink.fragments] == list(range(len(sink.fragments)))
    assert sink.index == os.path.join(out, "index.json")
    check_samples(iter(LocalDataset(out)), ROWS)
    check_no_orphans(local_files(out), (tmp_path / "ds" / "index.json").read_bytes())


def _die_once(batch: Any, markers: str) -> Any:
    kill_first_attempt(markers, f"id-{int(batch['id'][0])}")
    return batch


def test_s3_with_a_task_killed_and_retried(ray_session: Any, s3: Any, parquet_dir: Path, tmp_path: Path) -> None:
    import ray.data

    from astream.convert import MDSDatasink

    s3.create_bucket(Bucket="ray")
    markers = str(tmp_path / "markers")
    os.makedirs(markers)
    ds = (ray.data.read_parquet(str(parquet_dir)).select_columns(["id", "text"]).repartition(2)
          .map_batches(_die_once, fn_kwargs={"markers": markers}, batch_format="pyarrow", max_retries=3))
    sink = MDSDatasink("s3://ray/ds", size_limit=300)
    ds.write_datasink(sink, ray_remote_args={"max_retries": 3})
    assert os.listdir(markers)
    keys = {o["Key"][3:] for o in s3.list_objects_v2(Bucket="ray")["Contents"]}
    check_no_orphans(keys, s3.get_object(Bucket="ray", Key="ds/index.json")["Body"].read())
    read = StreamingDataset(remote="s3://ray/ds", local=str(tmp_path / "cache"), batch_size=4)
    assert sorted(int(read[i]["id"]) for i in range(len(read))) == list(range(ROWS))


def test_a_bad_type_fails_before_any_task_and_writes_no_index(ray_session: Any, tmp_path: Path) -> None:
    import datetime

    import ray.data

    from astream.convert import MDSDatasink

    out = tmp_path / "bad"
    ds = ray.data.from_items([{"t": datetime.time(1, 2)} for _ in range(4)])
    with pytest.raises(Exception, match="column 't'") as info:
        ds.write_datasink(MDSDatasink(str(out)))
    assert isinstance(info.value, ConfigError) or "ConfigError" in repr(info.value)
    assert not (out / "index.json").exists()


def test_nothing_listens_beyond_loopback(ray_session: Any) -> None:
    import socket
    import subprocess

    assert [name for _, name in socket.if_nameindex()] == ["lo"]
    listening = subprocess.run(["ss", "-ltnH"], capture_output=True, text=True, check=True).stdout.split("\n")
    addresses = {line.split()[3].rsplit(":", 1)[0] for line in listening if line.strip()}
    # A wildcard here can only mean lo: the namespace has no other interface.
    assert addresses <= {"127.0.0.1", "[::ffff:127.0.0.1]", "[::1]", "*", "0.0.0.0", "[::]"}, addresses


def test_cli_ray_engine(ray_session: Any, parquet_dir: Path, tmp_path: Path) -> None:
    from astream.cli import main

    out = tmp_path / "cli"
    assert main(["convert", str(parquet_dir), "-o", str(out), "--engine", "ray", "--parts", "2", "-q",
                 "--compression", "zstd"]) == 0
    check_samples(iter(LocalDataset(str(out))), ROWS)


def test_parquet_input_in_a_bucket(ray_session: Any, s3: Any, parquet_dir: Path, tmp_path: Path) -> None:
    from astream.convert import MDSDatasink
    from astream.convert.sources import read_files

    s3.create_bucket(Bucket="ray-input")
    for f in sorted(parquet_dir.glob("*.parquet")):
        s3.put_object(Bucket="ray-input", Key=f"in/{f.name}", Body=f.read_bytes())
    out = str(tmp_path / "from-bucket")
    read_files("ray", ["s3://ray-input/in/"], "parquet").write_datasink(MDSDatasink(out, size_limit=2000))
    check_samples(iter(LocalDataset(out)), ROWS)
