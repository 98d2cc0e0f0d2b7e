"""Shared fixtures. Layer-specific fixtures live in each tests/<layer>/conftest.py."""

from __future__ import annotations

from pathlib import Path

import pytest
from hypothesis import HealthCheck, settings

# The machines that run this suite are small and shared: a per-example deadline or a
# "too slow" health check would fail on load, not on a bug.
settings.register_profile(
    "astream", deadline=None, suppress_health_check=[HealthCheck.too_slow], print_blob=True
)
settings.load_profile("astream")

REPO = Path(__file__).resolve().parent.parent
# CI clones main into a fresh folder with shared/ copied beside it, as in development.
SHARED = REPO.parent / "shared"
FIXTURES = SHARED / "fixtures"


@pytest.fixture(scope="session")
def fixtures_dir() -> Path:
    """../shared/fixtures: datasets and orders recorded from mosaicml-streaming 0.13."""
    if not FIXTURES.is_dir():
        pytest.fail(f"fixtures not found at {FIXTURES}; the shared/ folder must sit beside the repository")
    return FIXTURES
