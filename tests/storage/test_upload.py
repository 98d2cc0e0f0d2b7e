"""RemoteMDSWriter: shards upload in the background, index.json last, failures surface."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

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
        write((str(tmp_path / "local"), f"{server.url}/ds"), options)
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


@pytest.fixture(autouse=True)
def _no_threads_left() -> Iterator[None]:
    import threading

    before = {t.name for t in threading.enumerate()}
    yield
    assert not [t.name for t in threading.enumerate() if t.name == "astream-upload" and t.name not in before]
