"""Fixtures of the coordination tests (helpers live in coordkit.py)."""

from __future__ import annotations

import asyncio
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web
from coordkit import FAST, LoopbackServer, RankProc, make_shards, start_rank

from astream._coord.config import CoordConfig


@pytest.fixture
def config() -> CoordConfig:
    return FAST



@pytest.fixture
def run_id() -> str:
    return f"test-{uuid.uuid4().hex[:12]}"



@pytest.fixture
def remote(tmp_path: Path) -> tuple[Path, dict[str, str]]:
    """A local 'remote' folder with 8 shards of 4 KiB."""
    folder = tmp_path / "remote"
    return folder, make_shards(folder, 8)



@pytest.fixture
def http_server(tmp_path: Path) -> Iterator[LoopbackServer]:
    """Serve tmp_path/'served' on 127.0.0.1 from a thread with its own event loop."""
    server = LoopbackServer(tmp_path / "served")
    server.root.mkdir()
    loop = asyncio.new_event_loop()
    started = threading.Event()
    runner: list[web.AppRunner] = []

    async def handle(request: web.Request) -> web.StreamResponse:
        name = request.match_info["name"]
        server.counts[name] += 1
        if server.delay:
            await asyncio.sleep(server.delay)
        if name in server.fail:
            return web.Response(status=500, text="injected failure")
        path = server.root / name
        if not path.is_file():
            return web.Response(status=404)
        return web.Response(body=path.read_bytes())

    async def start() -> None:
        app = web.Application()
        app.router.add_get("/{name:.+}", handle)
        r = web.AppRunner(app, access_log=None)
        await r.setup()
        site = web.TCPSite(r, "127.0.0.1", 0)
        await site.start()
        port = site._server.sockets[0].getsockname()[1]  # type: ignore[union-attr]
        server.url = f"http://127.0.0.1:{port}"
        runner.append(r)
        started.set()

    thread = threading.Thread(target=lambda: (loop.run_until_complete(start()), loop.run_forever()), daemon=True)
    thread.start()
    assert started.wait(10)
    yield server
    asyncio.run_coroutine_threadsafe(runner[0].cleanup(), loop).result(10)
    loop.call_soon_threadsafe(loop.stop)
    thread.join(10)
    loop.close()



@pytest.fixture
async def ranks(tmp_path: Path) -> Any:
    """Factory starting rank processes; kills any still running at teardown."""
    started: list[RankProc] = []
    log_dir = tmp_path / "logs"
    log_dir.mkdir()

    async def factory(spec: dict[str, Any]) -> RankProc:
        rank = await start_rank(spec, log_dir)
        started.append(rank)
        return rank

    factory.log_dir = log_dir  # type: ignore[attr-defined]
    yield factory
    for rank in started:
        rank.kill()
    for rank in started:
        await rank.finish(20)

