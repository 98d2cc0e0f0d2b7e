"""Uploading writers: shards upload in the background, index.json last, failures surface.

keep_local, progress_bar and max_workers as MosaicML's writers mean them, against a
loopback HTTP server, a real moto S3 server on 127.0.0.1 and a local remote.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from astream import CSVWriter, JSONWriter, LocalDataset, MDSWriter, TSVWriter
from astream._format.index import Index
from astream._storage import StorageOptions
from astream._storage.upload import RemoteMDSWriter
from astream.errors import ConfigError, UploadError
from astream.testing import Fault, LoopbackServer, memory_bucket, moto_s3

COLUMNS = {"data": "bytes", "i": "int"}


def write(out: Any, options: StorageOptions, n: int = 40, **kwargs: Any) -> RemoteMDSWriter:
    with RemoteMDSWriter(out, COLUMNS, compression="zstd", hashes=["xxh64"], size_limit=20_000,
                         options=options, **kwargs) as writer:
        for i in range(n):
            writer.write({"data": os.urandom(2000), "i": i})
    return writer


def files(root: Path) -> dict[str, bytes]:
    return {str(p.relative_to(root)): p.read_bytes() for p in sorted(root.rglob("*")) if p.is_file()}


def test_local_and_http_remote(tmp_path: Path, options: StorageOptions) -> None:
    remote = tmp_path / "served"
    remote.mkdir()
    with LoopbackServer(str(remote), allow_put=True) as server:
        write((str(tmp_path / "local"), f"{server.url}/ds"), options, keep_local=True)
        puts = [r.path for r in server.log if r.method == "PUT"]
    local = files(tmp_path / "local")
    assert len(local) > 3
    assert files(remote / "ds") == local
    assert puts[-1] == "ds/index.json"
    assert len(Index.load(remote / "ds" / "index.json").shards) == len(local) - 1


def test_s3_remote_from_a_staging_dir(tmp_path: Path, options: StorageOptions) -> None:
    with moto_s3("upbkt") as s3:
        writer = write("s3://upbkt/ds", options)
        keys = sorted(o["Key"] for o in s3.list_objects_v2(Bucket="upbkt")["Contents"])
        index = s3.get_object(Bucket="upbkt", Key="ds/index.json")["Body"].read()
    assert "ds/index.json" in keys
    assert len(keys) == len(Index.from_bytes(index).shards) + 1
    assert not os.path.exists(writer.local)  # the staging directory is gone


def test_memory_remote_and_plain_local(tmp_path: Path, options: StorageOptions) -> None:
    write("memory://upload-test/ds", options)
    bucket = memory_bucket("upload-test")
    assert "ds/index.json" in bucket
    assert len(Index.from_bytes(bucket["ds/index.json"]).shards) == len(bucket) - 1
    writer = write(str(tmp_path / "plain"), options)
    assert writer.remote is None


def test_a_failed_upload_raises_and_index_is_not_uploaded(tmp_path: Path, options: StorageOptions) -> None:
    remote = tmp_path / "served"
    remote.mkdir()
    with LoopbackServer(str(remote), allow_put=True) as server:
        server.add(Fault("status", match="ds/shard.00001*", status=500, times=None))
        with pytest.raises(UploadError, match=r"shard\.00001\.mds\.zstd: upload failed after 3 attempts"):
            write((str(tmp_path / "local"), f"{server.url}/ds"), options)
    assert not (remote / "ds" / "index.json").exists()


def test_bad_out(options: StorageOptions) -> None:
    with pytest.raises(ConfigError, match="local_dir, remote_url"):
        RemoteMDSWriter(("a", "b", "c"), COLUMNS)  # type: ignore[arg-type]
    with pytest.raises(ConfigError, match="max_pending"):
        RemoteMDSWriter("memory://x/y", COLUMNS, max_pending=0)


@pytest.mark.parametrize(
    ("kwargs", "name"),
    [({"max_workers": 0}, "max_workers"), ({"max_workers": True}, "max_workers"), ({"max_workers": 1.5}, "max_workers"),
     ({"keep_local": "yes"}, "keep_local"), ({"progress_bar": 1}, "progress_bar")],
)
@pytest.mark.parametrize("cls", [MDSWriter, JSONWriter, CSVWriter])
def test_bad_upload_parameters_are_named(tmp_path: Path, cls: type, kwargs: dict[str, Any], name: str) -> None:
    columns = COLUMNS if cls is MDSWriter else {"i": "int"}
    with pytest.raises(ConfigError, match=name):
        cls((str(tmp_path / "local"), str(tmp_path / "remote")), columns, **kwargs)
    assert not (tmp_path / "local").exists()  # refused before any file was made


def test_keep_local_false_deletes_each_uploaded_file(tmp_path: Path, options: StorageOptions) -> None:
    # A local remote (a plain folder): MosaicML's default deletes the local copy as it goes.
    local, remote = tmp_path / "local", tmp_path / "remote"
    write((str(local), str(remote)), options)
    uploaded = files(remote)
    assert len(uploaded) > 3
    assert "index.json" in uploaded
    assert not local.exists()
    ds = LocalDataset(str(remote))
    assert [ds[i]["i"] for i in range(len(ds))] == list(range(40))


def test_keep_local_true_keeps_the_staging_copy_of_a_remote_url(options: StorageOptions) -> None:
    with moto_s3("keepbkt") as s3:
        writer = write("s3://keepbkt/ds", options, keep_local=True)
        keys = {o["Key"].removeprefix("ds/") for o in s3.list_objects_v2(Bucket="keepbkt")["Contents"]}
        remote = {k: s3.get_object(Bucket="keepbkt", Key=f"ds/{k}")["Body"].read() for k in keys}
    try:
        assert files(Path(writer.local)) == remote
    finally:
        shutil.rmtree(writer.local)


@pytest.mark.parametrize("cls", [JSONWriter, CSVWriter, TSVWriter])
def test_text_writers_upload_to_s3(tmp_path: Path, options: StorageOptions, cls: type) -> None:
    local, bucket = tmp_path / "local", f"up-{cls.__name__.lower()}"
    with moto_s3(bucket) as s3:
        with cls((str(local), f"s3://{bucket}/t"), {"i": "int", "s": "str"}, size_limit=100, hashes=["xxh64"],
                 keep_local=True, max_workers=2, options=options) as writer:
            for i in range(30):
                writer.write({"i": i, "s": f"value {i}"})
        keys = [o["Key"] for o in s3.list_objects_v2(Bucket=bucket)["Contents"]]
        remote = {k.removeprefix("t/"): s3.get_object(Bucket=bucket, Key=k)["Body"].read() for k in keys}
    assert remote == files(local)
    assert sum(name.endswith(".meta") for name in remote) == len(writer.shards) > 2  # data + meta per shard
    ds = LocalDataset(str(local), validate_hash="xxh64")
    assert [ds[i] for i in range(len(ds))] == [{"i": i, "s": f"value {i}"} for i in range(30)]


@pytest.mark.parametrize("workers", [1, 3])
def test_max_workers_bounds_uploads_in_flight(tmp_path: Path, options: StorageOptions, workers: int) -> None:
    remote = tmp_path / "served"
    remote.mkdir()
    with LoopbackServer(str(remote), allow_put=True) as server:
        server.add(Fault("delay", match="ds/shard.*", seconds=0.25, times=None))
        write((str(tmp_path / "local"), f"{server.url}/ds"), options, n=24, max_workers=workers)
        peak = server.max_active
    assert peak == workers  # never more; and with slow PUTs queued, as many as allowed


def test_progress_bar_counts_uploaded_files(tmp_path: Path, options: StorageOptions,
                                            capsys: pytest.CaptureFixture[str]) -> None:
    write((str(tmp_path / "local"), str(tmp_path / "remote")), options, progress_bar=True)
    shown = capsys.readouterr().err
    uploaded = len(files(tmp_path / "remote"))
    assert "Uploading to" in shown
    assert f"{uploaded}file" in shown.replace(" ", "")  # tqdm's last refresh: "<n>file [..]"
    write((str(tmp_path / "l2"), str(tmp_path / "r2")), options)
    assert capsys.readouterr().err == ""  # no bar unless asked


@pytest.fixture(autouse=True)
def _no_threads_left() -> Iterator[None]:
    import threading

    before = {t.name for t in threading.enumerate()}
    yield
    assert not [t.name for t in threading.enumerate() if t.name == "astream-upload" and t.name not in before]
