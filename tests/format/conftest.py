"""Fixtures of the format tests."""

from __future__ import annotations

from pathlib import Path

import pytest


@pytest.fixture(scope="session")
def mds_dir(fixtures_dir: Path) -> Path:
    """../shared/fixtures/mds: datasets written by mosaicml-streaming 0.13."""
    return fixtures_dir / "mds"
