"""Fixtures of the ``astream`` command tests."""

from __future__ import annotations

from pathlib import Path

import pytest
from clikit import Run, run_cli, run_main, write_dataset


@pytest.fixture
def cli() -> Run:
    """Run the command as a subprocess."""
    return run_cli


@pytest.fixture
def main() -> Run:
    """Run the command's ``main()`` in this process."""
    return run_main


@pytest.fixture
def dataset(tmp_path: Path) -> Path:
    """A fresh zstd-compressed dataset with sha1 and xxh64 digests and several shards."""
    return write_dataset(tmp_path / "ds")
