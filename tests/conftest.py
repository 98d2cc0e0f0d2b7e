"""Shared fixtures. Layer-specific fixtures live in each tests/<layer>/conftest.py."""

from __future__ import annotations

import asyncio
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, settings

# The machines that run this suite are small and shared: a per-example deadline or a
# "too slow" health check would fail on load, not on a bug.
settings.register_profile(
    "astream", deadline=None, suppress_health_check=[HealthCheck.too_slow], print_blob=True
)
settings.load_profile("astream")

def pytest_asyncio_loop_factories(config: Any, item: Any) -> Mapping[str, Any]:
    """Test modules that set ``BOTH_LOOPS = True`` run every async test on asyncio and on uvloop."""
    factories: dict[str, Any] = {"asyncio": asyncio.new_event_loop}
    if getattr(getattr(item, "module", None), "BOTH_LOOPS", False):
        import uvloop

        factories["uvloop"] = uvloop.new_event_loop
    return factories


REPO = Path(__file__).resolve().parent.parent
# Everything the suite reads lives in the repository (tests/fixtures/README.md says what).
FIXTURES = REPO / "tests" / "fixtures"


@pytest.fixture(scope="session")
def fixtures_dir() -> Path:
    """tests/fixtures: datasets and orders recorded from mosaicml-streaming 0.13."""
    if not FIXTURES.is_dir():
        pytest.fail(f"fixtures not found at {FIXTURES}; they are part of the repository (git checkout tests/fixtures)")
    return FIXTURES
