"""Fixtures of the cache tests: small MDS datasets (via MDSWriter) served on 127.0.0.1."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from astream._format.index import Index
from astream._storage import RetryPolicy, StorageOptions, Timeouts
from astream.testing import LoopbackServer

FAST = StorageOptions(
    timeouts=Timeouts(download=1.0, connect=0.5),
    retry=RetryPolicy(retries=2, backoff=0.02, max_backoff=0.2),
    chunk_size=64 << 10,
)


from cachekit import write_dataset  # noqa: E402


@pytest.fixture
def options() -> StorageOptions:
    return FAST


@pytest.fixture
def make_dataset(tmp_path: Path) -> Callable[..., tuple[Path, Index]]:
    def make(name: str = "remote", **kwargs: Any) -> tuple[Path, Index]:
        root = tmp_path / name
        return root, write_dataset(root, **kwargs)

    return make


@pytest.fixture
def dataset(make_dataset: Callable[..., tuple[Path, Index]]) -> tuple[Path, Index]:
    return make_dataset()


@pytest.fixture
def server(dataset: tuple[Path, Index]) -> Iterator[LoopbackServer]:
    with LoopbackServer(str(dataset[0])) as srv:
        yield srv
