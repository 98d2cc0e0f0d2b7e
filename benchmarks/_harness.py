"""The harness of the checkout these benchmarks are in (``astream.cli._harness``), put first
on the path whatever astream is installed: the driver of a paired A/B is always this
checkout's, only the measured side's ``astream`` comes from ``--base``."""

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from astream.cli._harness import Bench, Metric, Server, data, fmt, parser, ratio
from astream.cli._harness.au import busy, largest

__all__ = ["Bench", "Metric", "Server", "busy", "data", "fmt", "largest", "parser", "ratio"]
