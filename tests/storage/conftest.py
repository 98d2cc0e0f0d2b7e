"""Fixtures of the storage tests: a fault-injecting loopback server over a folder of files."""

from __future__ import annotations

import os
from collections.abc import Iterator
from pathlib import Path

import pytest

from astream._storage import RetryPolicy, StorageOptions, Timeouts
from astream.testing import LoopbackServer

# Short real timeouts: these tests run on 2 shared cores.
FAST = StorageOptions(
    timeouts=Timeouts(download=1.0, connect=0.5),
    retry=RetryPolicy(retries=2, backoff=0.02, max_backoff=0.2),
    chunk_size=64 << 10,
)


@pytest.fixture
def options() -> StorageOptions:
    return FAST


@pytest.fixture
def files(tmp_path: Path) -> dict[str, bytes]:
    """A served folder: a few files of random bytes (one a bit over 1 MiB)."""
    root = tmp_path / "remote"
    (root / "sub").mkdir(parents=True)
    contents = {
        "small.bin": os.urandom(1000),
        "big.bin": os.urandom((1 << 20) + 12345),
        "sub/nested.bin": os.urandom(70000),
        "empty.bin": b"",
    }
    for name, data in contents.items():
        (root / name).write_bytes(data)
    return contents


@pytest.fixture
def server(tmp_path: Path, files: dict[str, bytes]) -> Iterator[LoopbackServer]:
    with LoopbackServer(str(tmp_path / "remote"), allow_put=True) as srv:
        yield srv
