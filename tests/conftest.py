"""Shared fixtures. Layer-specific fixtures live in each tests/<layer>/conftest.py."""

from __future__ import annotations

import asyncio
from collections.abc import Iterator, Mapping
from pathlib import Path
from typing import Any

import pytest
from blocking import debug_loop, detect_blocking
from hypothesis import HealthCheck, settings

# The machines that run this suite are small and shared: a per-example deadline or a
# "too slow" health check would fail on load, not on a bug.
settings.register_profile(
    "astream", deadline=None, suppress_health_check=[HealthCheck.too_slow], print_blob=True
)
settings.load_profile("astream")

# Where the engine, coordination and dataset code runs: asyncio's debug mode and the
# blocking-callback detector (tests/blocking.py) watch every async test there.
WATCHED = ("cache", "coord", "dataset")


def _watched(item: Any) -> bool:
    path = Path(str(getattr(item, "path", "")))
    return path.parent.name in WATCHED and path.parent.parent.name == "tests"


def pytest_asyncio_loop_factories(config: Any, item: Any) -> Mapping[str, Any]:
    """Every async test runs on asyncio and on uvloop (a module may opt out with
    ``BOTH_LOOPS = False`` and say why); watched tests with asyncio's debug mode on."""
    import uvloop

    factories: dict[str, Any] = {"asyncio": asyncio.new_event_loop}
    if getattr(getattr(item, "module", None), "BOTH_LOOPS", True):
        factories["uvloop"] = uvloop.new_event_loop
    if _watched(item):
        factories = {name: debug_loop(f) for name, f in factories.items()}
    return factories


@pytest.fixture(autouse=True)
def _no_blocking_callbacks(request: pytest.FixtureRequest) -> Iterator[None]:
    """Watched tests fail when a loop callback spent over 50 ms of CPU (tests/blocking.py)."""
    if not _watched(request.node):
        yield
        return
    with detect_blocking() as found:
        yield
    if found:
        worst = sorted(found, reverse=True)[:5]
        pytest.fail("callbacks held the event loop's thread (CPU seconds, callback):\n"
                    + "\n".join(f"  {spent:.3f} s  {what}" for spent, what in worst), pytrace=False)


REPO = Path(__file__).resolve().parent.parent
# Everything the suite reads lives in the repository (tests/fixtures/README.md says what).
FIXTURES = REPO / "tests" / "fixtures"


@pytest.fixture(scope="session")
def fixtures_dir() -> Path:
    """tests/fixtures: datasets and orders recorded from mosaicml-streaming 0.13."""
    if not FIXTURES.is_dir():
        pytest.fail(f"fixtures not found at {FIXTURES}; they are part of the repository (git checkout tests/fixtures)")
    return FIXTURES
