"""Storage.read_range on every backend: real files, the loopback HTTP server, moto's S3 server.

Every backend answers the same questions the same way: a middle range, a range that ends at
the end, an empty range (no request), a range past the end (DownloadError, not retried), a
missing object (RemoteNotFoundError) and bad bounds (ConfigError, before any I/O).
"""

from __future__ import annotations

import os
from collections.abc import AsyncIterator, Iterator
from pathlib import Path
from typing import Any

import aiohttp
import pytest
from aiohttp import web

from astream._storage import StorageOptions
from astream._storage.base import Storage
from astream._storage.http import HttpStorage
from astream._storage.local import LocalStorage
from astream._storage.sink import Sink
from astream.errors import (
    ConfigError,
    DownloadError,
    RangeNotSupportedError,
    RemoteNotFoundError,
    StorageError,
)
from astream.testing import Fault, LoopbackServer, MemoryStorage, memory_bucket

BAD_BOUNDS: list[tuple[Any, Any]] = [(-1, 5), (10, 9), (True, 5), (0, 2.5)]


async def check_backend(storage: Storage, url: str, missing: str, data: bytes) -> None:
    """The behaviour every backend shares, for an object ``url`` holding ``data``."""
    size = len(data)
    assert await storage.read_range(url, 100, 612) == data[100:612]
    assert await storage.read_range(url, size - 37, size) == data[-37:]
    assert await storage.read_range(url, 0, size) == data
    assert await storage.read_range(url, 5, 5) == b""
    assert await storage.read_range(missing, 5, 5) == b""  # no request, so no 404 either
    with pytest.raises(DownloadError, match=rf"is {size} bytes before byte {size + 1}") as past:
        await storage.read_range(url, 10, size + 1)
    assert url in str(past.value)
    assert not isinstance(past.value, (RangeNotSupportedError, RemoteNotFoundError))
    with pytest.raises(DownloadError, match=rf"no bytes {size + 10}:{size + 20}"):
        await storage.read_range(url, size + 10, size + 20)
    with pytest.raises(RemoteNotFoundError):
        await storage.read_range(missing, 0, 10)
    for start, end in BAD_BOUNDS:
        with pytest.raises(ConfigError, match="read_range"):
            await storage.read_range(url, start, end)


# -- local files ------------------------------------------------------------------------------
async def test_local(tmp_path: Path, files: dict[str, bytes], options: StorageOptions) -> None:
    remote = tmp_path / "remote"
    async with LocalStorage(options) as storage:
        await check_backend(storage, str(remote / "big.bin"), str(remote / "nope.bin"), files["big.bin"])
        nested = f"file://{remote}/sub/nested.bin"
        assert await storage.read_range(nested, 69_000, 70_000) == files["sub/nested.bin"][69_000:]


async def test_local_reads_through_numpy_offsets(tmp_path: Path, files: dict[str, bytes], options: StorageOptions) -> None:
    """Offsets straight out of an index array (numpy integers) are integers too."""
    np = pytest.importorskip("numpy")
    offsets = np.array([1000, 5000], dtype=np.int64)
    async with LocalStorage(options) as storage:
        got = await storage.read_range(str(tmp_path / "remote" / "big.bin"), offsets[0], offsets[1])
    assert got == files["big.bin"][1000:5000]


async def test_local_unreadable_file_is_a_download_error(tmp_path: Path, files: dict[str, bytes], options: StorageOptions) -> None:
    # A directory: open() works for root too, but reading it fails with EISDIR (not retried).
    async with LocalStorage(options) as storage:
        with pytest.raises(DownloadError, match="cannot read") as info:
            await storage.read_range(str(tmp_path / "remote" / "sub"), 0, 1)
    assert not isinstance(info.value, RemoteNotFoundError)


# -- HTTP -------------------------------------------------------------------------------------
async def test_http(server: LoopbackServer, files: dict[str, bytes], options: StorageOptions) -> None:
    async with HttpStorage(options) as storage:
        await check_backend(storage, f"{server.url}/big.bin", f"{server.url}/nope.bin", files["big.bin"])
    size = len(files["big.bin"])
    # One request per call, each for exactly the bytes asked: no HEAD first, no retries.
    assert [(r.method, r.path, r.range) for r in server.log] == [
        ("GET", "big.bin", "bytes=100-611"),
        ("GET", "big.bin", f"bytes={size - 37}-{size - 1}"),
        ("GET", "big.bin", f"bytes=0-{size - 1}"),
        ("GET", "big.bin", f"bytes=10-{size}"),
        ("GET", "big.bin", f"bytes={size + 10}-{size + 19}"),
        ("GET", "nope.bin", "bytes=0-9"),
    ]


async def test_http_server_without_ranges(tmp_path: Path, files: dict[str, bytes], options: StorageOptions) -> None:
    with LoopbackServer(str(tmp_path / "remote"), ranges=False) as server:
        async with HttpStorage(options) as storage:
            with pytest.raises(RangeNotSupportedError, match="HTTP 200") as info:
                await storage.read_range(f"{server.url}/big.bin", 10, 20)
            assert isinstance(info.value, DownloadError)
            assert server.count("big.bin") == 1  # not retried
            # The dropped connection leaves the session usable.
            assert await storage.read_bytes(f"{server.url}/small.bin") == files["small.bin"]


async def test_http_short_body_is_retried(server: LoopbackServer, files: dict[str, bytes], options: StorageOptions) -> None:
    server.add(Fault("truncate", match="big.bin", after=30_000))
    async with HttpStorage(options) as storage:
        got = await storage.read_range(f"{server.url}/big.bin", 200_000, 300_000)
    assert got == files["big.bin"][200_000:300_000]
    assert [r.range for r in server.log] == ["bytes=200000-299999"] * 2


async def test_http_5xx_is_retried_and_404_is_not(server: LoopbackServer, files: dict[str, bytes], options: StorageOptions) -> None:
    server.add(Fault("status", match="small.bin", status=503, times=2))
    server.add(Fault("status", match="gone.bin", status=410))
    async with HttpStorage(options) as storage:
        assert await storage.read_range(f"{server.url}/small.bin", 1, 3) == files["small.bin"][1:3]
        with pytest.raises(RemoteNotFoundError, match="HTTP 410"):
            await storage.read_range(f"{server.url}/gone.bin", 1, 3)
    assert server.count("small.bin") == 3
    assert server.count("gone.bin") == 1


async def test_http_faults_honour_the_range_end(server: LoopbackServer, files: dict[str, bytes], options: StorageOptions) -> None:
    """The fault-injecting path serves "first-last" ranges like FileResponse (it used to ignore last)."""
    # A stall that never comes (after more bytes than the file has) sends every request down
    # the fault path, which answers ranges itself instead of through FileResponse.
    server.add(Fault("stall", match="big.bin", after=1 << 40, times=None))
    async with HttpStorage(options) as storage:
        await check_backend(storage, f"{server.url}/big.bin", f"{server.url}/nope.bin", files["big.bin"])


@pytest.fixture
async def liar() -> AsyncIterator[tuple[str, list[dict[str, str]]]]:
    """A real aiohttp server on 127.0.0.1 answering every GET with the 206 queued for it."""
    answers: list[dict[str, str]] = []

    async def handle(request: web.Request) -> web.Response:
        spec = answers.pop(0)
        headers = {"Content-Range": spec["range"]} if spec["range"] else {}
        return web.Response(status=206, body=spec["body"].encode(), headers=headers)

    app = web.Application()
    app.router.add_get("/{tail:.*}", handle)
    runner = web.AppRunner(app, access_log=None, handle_signals=False)
    await runner.setup()
    site = web.TCPSite(runner, "127.0.0.1", 0)
    await site.start()
    assert site._server is not None
    port = site._server.sockets[0].getsockname()[1]  # type: ignore[attr-defined]
    try:
        yield f"http://127.0.0.1:{port}/obj", answers
    finally:
        await runner.cleanup()


@pytest.mark.parametrize(
    ("content_range", "body", "match"),
    [
        ("bytes 11-20/100", "x" * 10, "Content-Range is 'bytes 11-20/100'"),
        ("bytes 10-29/100", "x" * 20, "Content-Range is 'bytes 10-29/100'"),
        ("", "x" * 10, "Content-Range is None"),
        ("bytes 10-19/100", "x" * 12, "answer is 12 bytes long"),
    ],
    ids=["wrong-start", "wrong-end", "missing", "too-long"],
)
async def test_http_206_for_other_bytes_is_a_download_error(
    liar: tuple[str, list[dict[str, str]]], options: StorageOptions, content_range: str, body: str, match: str
) -> None:
    url, answers = liar
    answers.append({"range": content_range, "body": body})
    async with HttpStorage(options) as storage:
        with pytest.raises(DownloadError, match=match):
            await storage.read_range(url, 10, 20)
    assert answers == []  # one answer taken: not retried


# -- S3 (moto's server on 127.0.0.1) ----------------------------------------------------------
@pytest.fixture(scope="module")
def s3() -> Iterator[Any]:
    pytest.importorskip("aiobotocore", reason="s3:// needs the s3 extra")
    pytest.importorskip("moto.server", reason="moto[server] is not installed")
    from astream.testing import moto_s3

    with moto_s3("rng") as client:
        yield client


async def test_s3(s3: Any, files: dict[str, bytes], options: StorageOptions) -> None:
    from astream._storage.s3 import S3Storage

    data = files["big.bin"]
    s3.put_object(Bucket="rng", Key="ds/big.bin", Body=data)
    async with S3Storage(options) as storage:
        await check_backend(storage, "s3://rng/ds/big.bin", "s3://rng/ds/nope.bin", data)
        with pytest.raises(RemoteNotFoundError, match="NoSuchBucket"):
            await storage.read_range("s3://nobucket/x", 0, 1)


@pytest.fixture
def s3_env(monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("aiobotocore", reason="s3:// needs the s3 extra")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "x")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "x")


async def test_s3_endpoint_without_ranges(
    s3_env: None, tmp_path: Path, files: dict[str, bytes], options: StorageOptions, monkeypatch: pytest.MonkeyPatch
) -> None:
    """botocore's path-style GETs against the loopback server, as an S3-compatible store."""
    from astream._storage.s3 import S3Storage

    (tmp_path / "s3root" / "bkt").mkdir(parents=True)
    (tmp_path / "s3root" / "bkt" / "big.bin").write_bytes(files["big.bin"])
    with LoopbackServer(str(tmp_path / "s3root"), ranges=False) as server:
        monkeypatch.setenv("S3_ENDPOINT_URL", server.url)
        async with S3Storage(options) as storage:
            with pytest.raises(RangeNotSupportedError):
                await storage.read_range("s3://bkt/big.bin", 10, 20)
        assert server.count("bkt/big.bin") == 1


async def test_s3_short_body_is_retried(
    s3_env: None, tmp_path: Path, files: dict[str, bytes], options: StorageOptions, monkeypatch: pytest.MonkeyPatch
) -> None:
    from astream._storage.s3 import S3Storage

    (tmp_path / "s3root" / "bkt").mkdir(parents=True)
    (tmp_path / "s3root" / "bkt" / "big.bin").write_bytes(files["big.bin"])
    with LoopbackServer(str(tmp_path / "s3root")) as server:
        monkeypatch.setenv("S3_ENDPOINT_URL", server.url)
        server.add(Fault("reset", match="bkt/big.bin", after=20_000))
        async with S3Storage(options) as storage:
            got = await storage.read_range("s3://bkt/big.bin", 100_000, 200_000)
        assert [r.range for r in server.log] == ["bytes=100000-199999"] * 2
    assert got == files["big.bin"][100_000:200_000]


# -- memory and the base class ----------------------------------------------------------------
async def test_memory(options: StorageOptions) -> None:
    data = os.urandom(5000)
    memory_bucket("rng")["a/b.bin"] = data
    async with MemoryStorage(options) as storage:
        await check_backend(storage, "memory://rng/a/b.bin", "memory://rng/a/none.bin", data)


class ThirdParty(Storage):
    """A backend written before read_range existed (as registered with register())."""

    schemes = ("third",)

    async def fetch_into(
        self, url: str, sink: Sink, *, size: int | None = None, events: Any = None
    ) -> None:
        await sink.write(b"abc")

    async def read_bytes(self, url: str) -> bytes:
        return b"abc"

    async def exists(self, url: str) -> bool:
        return True

    async def put(self, local_path: str, url: str) -> None:
        raise StorageError("read-only")


async def test_base_class_default_raises_range_not_supported() -> None:
    async with ThirdParty() as storage:
        for start, end in [(0, 2), (1, 1)]:
            with pytest.raises(RangeNotSupportedError, match="third://x: ThirdParty cannot read a byte range"):
                await storage.read_range("third://x", start, end)
        for start, end in BAD_BOUNDS:
            with pytest.raises(ConfigError):
                await storage.read_range("third://x", start, end)


def test_range_not_supported_is_a_download_error() -> None:
    assert issubclass(RangeNotSupportedError, DownloadError)
    assert not issubclass(RangeNotSupportedError, FileNotFoundError)


async def test_http_connection_closed_not_drained(tmp_path: Path, options: StorageOptions) -> None:
    """A 200 to a Range request is not read: a huge shard would otherwise come over in full."""
    big = tmp_path / "remote2"
    big.mkdir()
    (big / "huge.bin").write_bytes(os.urandom(64 << 20))
    with LoopbackServer(str(big), ranges=False, chunk_size=1 << 20) as server:
        connector = aiohttp.TCPConnector(limit=1)
        async with aiohttp.ClientSession(connector=connector, auto_decompress=False) as session:
            async with HttpStorage(options, session=session) as storage:
                with pytest.raises(RangeNotSupportedError):
                    await storage.read_range(f"{server.url}/huge.bin", 0, 10)
            # The connection went away with the unread body instead of back into the pool.
            assert sum(len(v) for v in connector._conns.values()) == 0
