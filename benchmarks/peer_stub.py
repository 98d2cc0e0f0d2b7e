"""Make mosaicml-streaming importable without torchvision, for the benchmarks' peer side.

``import streaming`` imports ``streaming.vision``, whose ``__init__`` imports torchvision,
which the peer interpreter lacks (docs/bench/peer.md). An empty package registered under
that name first stands in for it; nothing the benchmarks use lives there.
"""

from __future__ import annotations

import sys
import types


def stub_streaming_vision() -> None:
    """Register an empty ``streaming.vision`` package unless one is already imported."""
    stub = types.ModuleType("streaming.vision")
    stub.__path__ = []  # type: ignore[attr-defined]
    sys.modules.setdefault("streaming.vision", stub)
