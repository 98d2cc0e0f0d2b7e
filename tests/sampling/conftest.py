"""Sampling tests: golden orders (see golden.py), properties, and optional peer comparisons."""

from __future__ import annotations

from pathlib import Path

import pytest


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    # Tiny and degenerate configurations make the sampling layer warn (repeats, poor mixing)
    # exactly where MosaicML warns; the golden tests go through many of them on purpose.
    here = Path(__file__).parent
    for item in items:
        if here in Path(str(item.fspath)).parents:
            item.add_marker(pytest.mark.filterwarnings("ignore::astream.sampling.SamplingWarning"))
