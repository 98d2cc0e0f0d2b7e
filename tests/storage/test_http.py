"""The HTTP backend against a real aiohttp server on 127.0.0.1 that misbehaves on request."""

from __future__ import annotations

import asyncio
import gc
import time
from pathlib import Path

import aiohttp
import pytest

from astream._storage import FileSink, StorageOptions
from astream._storage.http import HttpStorage
from astream.errors import DownloadError, DownloadTimeout, RemoteNotFoundError, UploadError, UsageError
from astream.testing import Fault, LoopbackServer, free_port


class Events:
    def __init__(self) -> None:
        self.retries: list[tuple[int, bool]] = []
        self.bytes = 0

    def on_retry(self, url: str, attempt: int, cause: BaseException, throttled: bool) -> None:
        self.retries.append((attempt, throttled))

    def on_bytes(self, count: int) -> None:
        self.bytes += count


def leftovers(folder: Path) -> list[str]:
    return sorted(p.name for p in folder.iterdir()) if folder.exists() else []


async def test_fetch_streams_the_whole_file(server: LoopbackServer, options: StorageOptions, files: dict[str, bytes], tmp_path: Path) -> None:
    events = Events()
    async with HttpStorage(options, events) as storage:
        dest = tmp_path / "out" / "big.bin"
        n = await storage.fetch(f"{server.url}/big.bin", str(dest), size=len(files["big.bin"]))
        assert n == len(files["big.bin"]) == events.bytes
        assert dest.read_bytes() == files["big.bin"]
        await storage.fetch(f"{server.url}/empty.bin", str(tmp_path / "out" / "empty.bin"), size=0)
        assert (tmp_path / "out" / "empty.bin").read_bytes() == b""
        assert await storage.read_bytes(f"{server.url}/sub/nested.bin") == files["sub/nested.bin"]
        assert await storage.exists(f"{server.url}/small.bin")
        assert not await storage.exists(f"{server.url}/nope.bin")
    assert leftovers(tmp_path / "out") == ["big.bin", "empty.bin"]


async def test_5xx_is_retried_then_succeeds(server: LoopbackServer, options: StorageOptions, files: dict[str, bytes], tmp_path: Path) -> None:
    server.add(Fault("status", match="small.bin", status=500, times=2))
    events = Events()
    async with HttpStorage(options, events) as storage:
        await storage.fetch(f"{server.url}/small.bin", str(tmp_path / "s"))
    assert (tmp_path / "s").read_bytes() == files["small.bin"]
    assert server.count("small.bin") == 3
    assert events.retries == [(1, False), (2, False)]


async def test_429_honours_retry_after_and_reports_throttling(server: LoopbackServer, tmp_path: Path) -> None:
    from astream._storage import RetryPolicy, Timeouts

    options = StorageOptions(timeouts=Timeouts(download=1.0), retry=RetryPolicy(retries=1, backoff=0.0, max_backoff=2.0))
    server.add(Fault("status", match="small.bin", status=429, retry_after="0.4"))
    events = Events()
    async with HttpStorage(options, events) as storage:
        start = time.monotonic()
        await storage.fetch(f"{server.url}/small.bin", str(tmp_path / "s"))
        assert time.monotonic() - start >= 0.39
    assert events.retries == [(1, True)]


async def test_404_fails_at_once_naming_url_and_status(server: LoopbackServer, options: StorageOptions, tmp_path: Path) -> None:
    async with HttpStorage(options) as storage:
        with pytest.raises(RemoteNotFoundError, match=r"/missing\.bin: HTTP 404") as info:
            await storage.fetch(f"{server.url}/missing.bin", str(tmp_path / "m"))
    assert isinstance(info.value, FileNotFoundError)
    assert server.count("missing.bin") == 1
    assert leftovers(tmp_path) == ["remote"]


async def test_other_4xx_is_not_retried(server: LoopbackServer, options: StorageOptions, tmp_path: Path) -> None:
    server.add(Fault("status", match="small.bin", status=403, times=None))
    async with HttpStorage(options) as storage:
        with pytest.raises(DownloadError, match=r"HTTP 403.*not retried"):
            await storage.fetch(f"{server.url}/small.bin", str(tmp_path / "m"))
    assert server.count("small.bin") == 1


async def test_reset_mid_body_resumes_with_a_range_request(
    server: LoopbackServer, options: StorageOptions, files: dict[str, bytes], tmp_path: Path
) -> None:
    server.add(Fault("reset", match="big.bin", after=300_000))
    async with HttpStorage(options) as storage:
        await storage.fetch(f"{server.url}/big.bin", str(tmp_path / "b"), size=len(files["big.bin"]))
    assert (tmp_path / "b").read_bytes() == files["big.bin"]
    ranges = [r.range for r in server.log if r.path == "big.bin"]
    assert ranges[0] is None
    assert ranges[1] is not None
    assert ranges[1].startswith("bytes=")
    assert ranges[1] != "bytes=0-"


async def test_without_range_support_a_cut_transfer_restarts(
    tmp_path: Path, files: dict[str, bytes], options: StorageOptions
) -> None:
    with LoopbackServer(str(tmp_path / "remote"), ranges=False) as srv:
        srv.add(Fault("truncate", match="big.bin", after=200_000))
        async with HttpStorage(options) as storage:
            await storage.fetch(f"{srv.url}/big.bin", str(tmp_path / "b"), size=len(files["big.bin"]))
        assert (tmp_path / "b").read_bytes() == files["big.bin"]
        assert srv.count("big.bin") == 2


async def test_slow_first_byte_times_out_within_the_bound(server: LoopbackServer, tmp_path: Path) -> None:
    from astream._storage import RetryPolicy, Timeouts

    options = StorageOptions(timeouts=Timeouts(download=0.2), retry=RetryPolicy(retries=1, backoff=0.01, max_backoff=0.01))
    server.add(Fault("delay", match="small.bin", seconds=1.0, times=None))
    async with HttpStorage(options) as storage:
        start = time.monotonic()
        with pytest.raises(DownloadTimeout, match=r"small\.bin: download failed after 2 attempts.*timed out") as info:
            await storage.fetch(f"{server.url}/small.bin", str(tmp_path / "s"))
        elapsed = time.monotonic() - start
    assert isinstance(info.value, TimeoutError)
    assert elapsed <= options.retry.worst_case(options.timeouts) + 0.3
    assert leftovers(tmp_path) == ["remote"]


async def test_a_stall_mid_body_times_out_and_resumes(
    server: LoopbackServer, options: StorageOptions, files: dict[str, bytes], tmp_path: Path
) -> None:
    server.add(Fault("stall", match="big.bin", after=100_000, seconds=3.0))
    async with HttpStorage(options) as storage:
        await storage.fetch(f"{server.url}/big.bin", str(tmp_path / "b"), size=len(files["big.bin"]))
    assert (tmp_path / "b").read_bytes() == files["big.bin"]
    assert server.count("big.bin") == 2


async def test_unreachable_port_fails_within_the_bound(options: StorageOptions, tmp_path: Path) -> None:
    url = f"http://127.0.0.1:{free_port()}/x.bin"
    async with HttpStorage(options) as storage:
        start = time.monotonic()
        with pytest.raises(DownloadError, match=r"x\.bin: download failed after 3 attempts.*last cause: Client") as info:
            await storage.fetch(url, str(tmp_path / "x"))
    assert time.monotonic() - start <= options.retry.worst_case(options.timeouts)
    assert isinstance(info.value.__cause__, Exception)
    assert leftovers(tmp_path) == []


async def test_dns_failure_is_a_download_error(options: StorageOptions, tmp_path: Path) -> None:
    async with HttpStorage(options) as storage:
        start = time.monotonic()
        with pytest.raises(DownloadError, match=r"nonexistent\.invalid"):
            await storage.fetch("http://nonexistent.invalid/x.bin", str(tmp_path / "x"))
    assert time.monotonic() - start <= options.retry.worst_case(options.timeouts) + 1.0


async def test_a_remote_of_another_size_is_rejected_at_once(server: LoopbackServer, options: StorageOptions, tmp_path: Path) -> None:
    async with HttpStorage(options) as storage:
        with pytest.raises(DownloadError, match=r"1000 bytes but index\.json says 999"):
            await storage.fetch(f"{server.url}/small.bin", str(tmp_path / "s"), size=999)
    assert server.count("small.bin") == 1
    assert leftovers(tmp_path) == ["remote"]


async def test_cancellation_leaves_no_temporary(server: LoopbackServer, options: StorageOptions, tmp_path: Path) -> None:
    server.add(Fault("stall", match="big.bin", after=100_000, seconds=0.8))
    out = tmp_path / "out"
    async with HttpStorage(options) as storage:
        task = asyncio.ensure_future(storage.fetch(f"{server.url}/big.bin", str(out / "b")))
        await asyncio.sleep(0.3)
        task.cancel()
        with pytest.raises(asyncio.CancelledError):
            await task
    await asyncio.sleep(0.05)
    assert leftovers(out) == []


async def test_put_uploads(server: LoopbackServer, options: StorageOptions, tmp_path: Path) -> None:
    src = tmp_path / "up.bin"
    src.write_bytes(b"x" * 300_000)
    async with HttpStorage(options) as storage:
        await storage.put(str(src), f"{server.url}/uploaded/up.bin")
    assert (tmp_path / "remote" / "uploaded" / "up.bin").read_bytes() == src.read_bytes()


async def test_put_refused_is_an_upload_error(tmp_path: Path, options: StorageOptions) -> None:
    src = tmp_path / "up.bin"
    src.write_bytes(b"x")
    with LoopbackServer(str(tmp_path)) as srv:
        async with HttpStorage(options) as storage:
            with pytest.raises(UploadError, match="HTTP 405"):
                await storage.put(str(src), f"{srv.url}/up2.bin")


async def test_an_injected_session_is_not_closed(server: LoopbackServer, options: StorageOptions, tmp_path: Path) -> None:
    async with aiohttp.ClientSession() as session:
        storage = HttpStorage(options, session=session)
        await storage.fetch(f"{server.url}/small.bin", str(tmp_path / "s"))
        await storage.aclose()
        await storage.aclose()  # idempotent
        assert not session.closed
        with pytest.raises(UsageError, match="closed"):
            await storage.fetch(f"{server.url}/small.bin", str(tmp_path / "s"))


async def test_a_forgotten_storage_warns(server: LoopbackServer, options: StorageOptions) -> None:
    storage = HttpStorage(options)
    await storage.read_bytes(f"{server.url}/small.bin")
    session = storage._session
    assert session is not None
    try:
        with pytest.warns(ResourceWarning, match="HttpStorage was not closed"):  # noqa: PT031
            del storage
            gc.collect()
    finally:
        await session.close()


async def test_file_sink_commit_is_atomic(tmp_path: Path) -> None:
    sink = FileSink(str(tmp_path / "f"))
    await sink.write(b"abc")
    assert not (tmp_path / "f").exists()
    await sink.commit()
    assert (tmp_path / "f").read_bytes() == b"abc"
    assert leftovers(tmp_path) == ["f"]
