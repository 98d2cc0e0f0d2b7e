"""Fixtures of the coordination tests (helpers live in coordkit.py)."""

from __future__ import annotations

import uuid
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from coordkit import FAST, RankProc, make_shards, start_rank

from astream._coord.config import CoordConfig
from astream.testing import LoopbackServer


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
    """astream.testing's loopback server on 127.0.0.1 over tmp_path/'served' (it counts requests)."""
    root = tmp_path / "served"
    root.mkdir()
    with LoopbackServer(str(root)) as server:
        yield server


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

