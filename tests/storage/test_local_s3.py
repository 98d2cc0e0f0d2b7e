"""Local/file:// remotes, moto's S3 server on 127.0.0.1, the registry and the loop helpers."""

from __future__ import annotations

import asyncio
import contextlib
import os
import sys
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from astream._storage import StorageOptions, StoragePool, join_url, scheme_of, storage_class
from astream._storage.local import LocalStorage
from astream._storage.loop import LoopThread, new_event_loop, run, within
from astream.errors import ConfigError, DownloadError, RemoteNotFoundError, UploadError
from astream.testing import MemoryStorage, memory_bucket, moto_s3


async def test_local_and_file_urls(tmp_path: Path, files: dict[str, bytes], options: StorageOptions) -> None:
    remote = tmp_path / "remote"
    async with LocalStorage(options) as storage:
        await storage.fetch(str(remote / "big.bin"), str(tmp_path / "a"), size=len(files["big.bin"]))
        await storage.fetch(f"file://{remote}/sub/nested.bin", str(tmp_path / "b"))
        assert (tmp_path / "a").read_bytes() == files["big.bin"]
        assert (tmp_path / "b").read_bytes() == files["sub/nested.bin"]
        assert await storage.exists(f"file://{remote}/small.bin")
        assert await storage.read_bytes(str(remote / "small.bin")) == files["small.bin"]
        with pytest.raises(RemoteNotFoundError, match="no such file"):
            await storage.fetch(str(remote / "nope"), str(tmp_path / "c"))
        with pytest.raises(DownloadError, match=r"index\.json says 5"):
            await storage.fetch(str(remote / "small.bin"), str(tmp_path / "c"), size=5)
        await storage.put(str(tmp_path / "a"), str(tmp_path / "up" / "a"))
        assert (tmp_path / "up" / "a").read_bytes() == files["big.bin"]
    assert not (tmp_path / "c").exists()


async def test_local_permission_denied(tmp_path: Path, options: StorageOptions, monkeypatch: pytest.MonkeyPatch) -> None:
    import aiofiles

    def denied(*args: Any, **kwargs: Any) -> Any:
        raise PermissionError(13, "Permission denied")

    real_open = os.open

    def os_open(path: Any, *args: Any, **kwargs: Any) -> int:
        if str(path).endswith("small.bin"):
            denied()
        return real_open(path, *args, **kwargs)

    monkeypatch.setattr(aiofiles, "open", denied)
    monkeypatch.setattr(os, "open", os_open)  # the one-job path of buffered sinks
    async with LocalStorage(options) as storage:
        with pytest.raises(DownloadError, match="permission denied"):
            await storage.fetch(str(tmp_path / "remote" / "small.bin"), str(tmp_path / "x"))


async def test_local_put_to_an_unwritable_place_is_an_upload_error(tmp_path: Path, options: StorageOptions) -> None:
    (tmp_path / "file").write_bytes(b"x")
    async with LocalStorage(options) as storage:
        with pytest.raises(UploadError):
            await storage.put(str(tmp_path / "file"), str(tmp_path / "file" / "below"))


@pytest.fixture(scope="module")
def s3() -> Iterator[Any]:
    with moto_s3("bkt") as client:
        yield client


async def test_s3_round_trip(s3: Any, tmp_path: Path, options: StorageOptions) -> None:
    from astream._storage.s3 import S3Storage

    data = os.urandom(300_000)
    s3.put_object(Bucket="bkt", Key="ds/shard.bin", Body=data)
    async with S3Storage(options) as storage:
        await storage.fetch("s3://bkt/ds/shard.bin", str(tmp_path / "s"), size=len(data))
        assert (tmp_path / "s").read_bytes() == data
        assert await storage.read_bytes("s3://bkt/ds/shard.bin") == data
        assert await storage.exists("s3://bkt/ds/shard.bin")
        assert not await storage.exists("s3://bkt/ds/none.bin")
        await storage.put(str(tmp_path / "s"), "s3://bkt/up/s.bin")
        assert s3.get_object(Bucket="bkt", Key="up/s.bin")["Body"].read() == data
        with pytest.raises(RemoteNotFoundError, match=r"s3://bkt/ds/none\.bin"):
            await storage.fetch("s3://bkt/ds/none.bin", str(tmp_path / "n"))
        with pytest.raises(RemoteNotFoundError, match="NoSuchBucket"):
            await storage.fetch("s3://nobucket/x", str(tmp_path / "n"))
        with pytest.raises(DownloadError, match=r"index\.json says 7"):
            await storage.fetch("s3://bkt/ds/shard.bin", str(tmp_path / "n"), size=7)
    assert not (tmp_path / "n").exists()


async def test_s3_unreachable_endpoint_fails_within_the_bound(
    tmp_path: Path, options: StorageOptions, monkeypatch: pytest.MonkeyPatch
) -> None:
    from astream._storage.s3 import S3Storage
    from astream.testing import free_port

    monkeypatch.setenv("S3_ENDPOINT_URL", f"http://127.0.0.1:{free_port()}")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "x")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "x")
    async with S3Storage(options) as storage:
        start = time.monotonic()
        with pytest.raises(DownloadError, match="after 3 attempts"):
            await storage.fetch("s3://b/k", str(tmp_path / "k"))
    assert time.monotonic() - start <= options.retry.worst_case(options.timeouts)


async def test_memory_storage_and_pool(tmp_path: Path) -> None:
    memory_bucket("t1")["a/b.bin"] = b"hello"
    async with StoragePool() as pool:
        storage = pool.get("memory://t1/a/b.bin")
        assert isinstance(storage, MemoryStorage)
        assert pool.get("memory://t1/other") is storage
        assert isinstance(pool.get("/some/path"), LocalStorage)
        assert pool.get("file:///x") is pool.get("/y")
        await storage.fetch("memory://t1/a/b.bin", str(tmp_path / "b"))
    assert (tmp_path / "b").read_bytes() == b"hello"


def test_scheme_and_join() -> None:
    assert scheme_of("/a/b") == ""
    assert scheme_of("S3://b/k") == "s3"
    assert join_url("http://h/ds/", "train", "index.json") == "http://h/ds/train/index.json"
    assert join_url("/data/ds", None, "3/shard.00000.mds") == "/data/ds/3/shard.00000.mds"
    with pytest.raises(ConfigError, match="unsupported scheme 'oci'"):
        storage_class("oci://bucket/x")


def test_run_uses_uvloop_without_touching_the_global_policy() -> None:
    policy = asyncio.get_event_loop_policy()

    async def loop_type() -> str:
        return type(asyncio.get_running_loop()).__module__

    assert run(loop_type()).startswith("uvloop")
    assert run(loop_type(), use_uvloop=False).startswith("asyncio")
    assert asyncio.get_event_loop_policy() is policy
    loop = new_event_loop(False)
    loop.close()


def test_loop_thread_runs_coroutines_and_closes_idempotently() -> None:
    async def where() -> str:
        await asyncio.sleep(0)
        return type(asyncio.get_running_loop()).__module__

    with LoopThread() as thread:
        assert thread.call(where()).startswith("uvloop")
    thread.close()
    assert sys.modules.get("uvloop") is not None


def test_loop_thread_close_waits_for_tasks_started_by_cleanup() -> None:
    """A task started by cleanup code during close is cancelled and waited for too."""
    started: list[asyncio.Task[None]] = []
    finished: list[str] = []

    async def cleanup() -> None:
        try:
            await asyncio.sleep(3600)
        finally:
            finished.append("cleanup")

    async def long_running() -> None:
        try:
            await asyncio.sleep(3600)
        except asyncio.CancelledError:
            started.append(asyncio.get_running_loop().create_task(cleanup()))  # not in all_tasks() before
            raise

    thread = LoopThread()
    thread.submit(long_running())
    time.sleep(0.05)
    thread.close()
    assert len(started) == 1
    assert started[0].done()
    assert finished == ["cleanup"]


@pytest.mark.parametrize("bounded", [within, asyncio.wait_for], ids=["within", "asyncio.wait_for"])
async def test_a_cancellation_racing_completion_is_not_lost(bounded: Any) -> None:
    """The awaited future completes and the task is cancelled in the same loop step."""
    loop = asyncio.get_running_loop()
    fut = loop.create_future()
    after: list[str] = []

    async def waiter() -> None:
        if bounded is within:
            await within(5, fut)
        else:
            await bounded(fut, 5)
        after.append("went on as if not cancelled")
        await asyncio.sleep(3600)

    task = asyncio.create_task(waiter())
    await asyncio.sleep(0)  # the waiter now waits on fut
    fut.set_result(None)
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError, TimeoutError):
        await asyncio.wait_for(asyncio.shield(task), 0.5)
    task.cancel()
    with contextlib.suppress(asyncio.CancelledError):
        await task
    if bounded is within or sys.version_info >= (3, 12):
        assert after == []
    else:  # what `within` exists for: 3.11's wait_for swallows this cancellation (gh-86296)
        assert after == ["went on as if not cancelled"]


async def test_s3_resumes_a_cut_transfer_with_a_range(
    tmp_path: Path, files: dict[str, bytes], options: StorageOptions, monkeypatch: pytest.MonkeyPatch
) -> None:
    """botocore's path-style GETs against the fault-injecting server: a reset mid-body resumes."""
    from astream._storage.s3 import S3Storage
    from astream.testing import Fault, LoopbackServer

    bucket = tmp_path / "s3root" / "bkt"
    bucket.mkdir(parents=True)
    (bucket / "big.bin").write_bytes(files["big.bin"])
    with LoopbackServer(str(tmp_path / "s3root")) as server:
        monkeypatch.setenv("S3_ENDPOINT_URL", server.url)
        monkeypatch.setenv("AWS_ACCESS_KEY_ID", "x")
        monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "x")
        server.add(Fault("reset", match="bkt/big.bin", after=300_000))
        async with S3Storage(options) as storage:
            await storage.fetch("s3://bkt/big.bin", str(tmp_path / "b"), size=len(files["big.bin"]))
        ranges = [r.range for r in server.log if r.path == "bkt/big.bin"]
    assert (tmp_path / "b").read_bytes() == files["big.bin"]
    assert ranges[0] is None
    assert ranges[1] is not None
    assert ranges[1].startswith("bytes=")


async def test_a_sink_runs_one_job_at_a_time_even_after_a_waiter_gave_up() -> None:
    import threading

    from astream._storage.sink import BufferedSink

    sink = BufferedSink()
    gate = threading.Event()
    active: list[int] = []
    lock = threading.Lock()

    def job(name: str) -> None:
        with lock:
            active.append(1)
            overlap = len(active)
        if name == "slow":
            assert gate.wait(10)
        with lock:
            active.pop()
        assert overlap == 1, "two jobs of one sink ran at once"

    slow = asyncio.ensure_future(sink.run(job, "slow"))
    await asyncio.sleep(0.05)
    slow.cancel()  # like a timeout: the task gives up, the thread keeps running
    second = asyncio.ensure_future(sink.run(job, "second"))
    await asyncio.sleep(0.05)
    assert not second.done()  # waits for the slow one's thread
    gate.set()
    await second
