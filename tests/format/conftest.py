"""Fixtures of the format tests."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def mds_dir(fixtures_dir: Path) -> Path:
    """tests/fixtures/mds: datasets written by mosaicml-streaming 0.13."""
    return fixtures_dir / "mds"
