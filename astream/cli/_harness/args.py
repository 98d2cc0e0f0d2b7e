"""The arguments every benchmark takes, declared once."""

from __future__ import annotations

import argparse
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path

from astream.cli._harness.peers import PEERS

__all__ = ["data_folder", "parser", "peer_python_arg"]


def data_folder(name: str) -> Path:
    """Where a benchmark builds its datasets: ``$ASTREAM_BENCH_DATA/<name>``, else the temp dir's
    ``astream-bench/<name>`` (never the repository)."""
    root = os.environ.get("ASTREAM_BENCH_DATA", str(Path(tempfile.gettempdir()) / "astream-bench"))
    return Path(root) / name


def peer_python_arg(value: str) -> tuple[str, str]:
    """``--peer-python NAME=PATH`` (a bare PATH: mosaicml's) as ``(name, path)``."""
    name, sep, path = value.partition("=")
    if not sep:  # a bare path: mosaicml-streaming's, as the benchmarks always took it
        return "mosaicml", value
    if name not in PEERS:
        raise argparse.ArgumentTypeError(f"no peer {name!r}; the peers are {', '.join(PEERS)}")
    return name, path


def parser(doc: str, name: str, libs: Sequence[str] = (), runs: int = 3) -> argparse.ArgumentParser:
    """A parser with the common options: ``--runs``, ``--data``, ``--json``, the paired A/B's
    ``--base``/``--head``, and (where the benchmark has peers) ``--libs``, ``--peer-python``
    and ``--install-peers``."""
    p = argparse.ArgumentParser(description=doc, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--runs", type=int, default=runs, help=f"rounds of fresh processes (default {runs})")
    p.add_argument("--data", default=str(data_folder(name)), help="where the datasets are built (once)")
    p.add_argument("--json", metavar="FILE", help="append the results to FILE as JSON lines")
    p.add_argument("--base", metavar="REF", help="paired A/B: also run astream from REF (a checkout folder, or a "
                   "commit of this repository), each round a process per side, in alternating order")
    p.add_argument("--head", metavar="REF", help="the B side of the A/B (default: this checkout)")
    p.add_argument("--scale", type=float, default=1.0, help="datasets this many times their size (a smoke run: 0.05)")
    p.add_argument("--bandwidth", type=float, metavar="B", help="throttle the loopback server (where there is one) "
                   "to B bytes per second, one link shared by every response")
    p.add_argument("-q", "--quiet", action="store_true", help="no progress bar")
    if libs:
        p.add_argument("--libs", nargs="*", default=list(libs), choices=list(libs),
                       help="which libraries (peers run where their interpreter is found)")
        p.add_argument("--peer-python", action="append", type=peer_python_arg, metavar="NAME=PATH",
                       help=f"a peer's interpreter ({', '.join(PEERS)}; a bare PATH is mosaicml's); else from "
                       "the environment (ASTREAM_PEER_PYTHON, ...) or the peers' folder")
        p.add_argument("--install-peers", nargs="*", default=[], choices=list(PEERS), metavar="PEER",
                       help="create these peers' environments where missing (pinned versions; minutes each)")
    return p
