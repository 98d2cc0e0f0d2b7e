"""``astream bench compare``: astream against whichever peers are installed, on this machine.

Runs the headline comparisons (:mod:`astream.cli._harness.compare`) in fresh processes,
prints one table, writes every run as JSON lines (``results.jsonl`` in ``--out``) and, with
the ``plot`` extra, PNG charts beside it. The peers (mosaicml-streaming, LitData, Hugging
Face ``datasets``, ``webdataset``) are found as the benchmarks find them
(``--peer-python NAME=PATH``, their environment variables, the peers' folder) or made with
``--install-peers``.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from pathlib import Path
from typing import Any

from astream.cli._output import CommandError, progress

__all__ = ["add_parser", "run"]


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    """Declare ``astream bench compare`` (reached as ``bench compare``: see :func:`astream.cli.main`)."""
    from astream.cli._harness.args import peer_python_arg
    from astream.cli._harness.peers import PEERS

    p = sub.add_parser("bench-compare", parents=[common], prog="astream bench compare",
                       description="Compare astream with the installed peers (mosaicml-streaming, LitData, "
                                   "Hugging Face datasets, webdataset) on this machine: warm and cold epochs over "
                                   "loopback, 0 and N workers, Parquet, WebDataset, and the accelerator-"
                                   "utilisation search. One table, JSON lines and (with astream[plot]) PNG charts.")
    p.add_argument("--quick", action="store_true", help="small datasets, one run each: about a minute")
    p.add_argument("--data", metavar="FOLDER", help="your own dataset instead of the built ones: an MDS folder "
                   "(index.json), a folder of Parquet files or of WebDataset tars")
    p.add_argument("--out", default="astream-bench-compare", help="where results.jsonl and the charts go "
                   "(default: ./astream-bench-compare)")
    p.add_argument("--runs", type=int, help="fresh processes per case (default: 3, 1 with --quick)")
    p.add_argument("--workers", type=int, default=2, help="N of the N-workers cases (default: 2)")
    p.add_argument("--max-accelerators", type=int, help="cap of the accelerator search (default: 16, 4 with --quick)")
    p.add_argument("--no-accelerators", action="store_true", help="skip the accelerator-utilisation search")
    p.add_argument("--work", metavar="FOLDER", help="where the datasets are built (default: $ASTREAM_BENCH_DATA/"
                   "compare, else the temp dir's astream-bench/compare)")
    p.add_argument("--peer-python", action="append", type=peer_python_arg, metavar="NAME=PATH",
                   help=f"a peer's interpreter ({', '.join(PEERS)})")
    p.add_argument("--peers", nargs="*", choices=list(PEERS), metavar="PEER",
                   help="compare with these peers only (default: every one found; none given: astream alone)")
    p.add_argument("--install-peers", nargs="*", default=[], choices=list(PEERS), metavar="PEER",
                   help="create these peers' environments where missing (pinned versions; minutes each)")
    p.set_defaults(func=run)


def _print(rows: list[Any]) -> None:
    from astream.cli._harness.bench import fmt, ratio

    print("| what | astream | faster peer | astream vs peer | floor |")
    print("|---|---:|---:|---:|---:|")
    for r in rows:
        peer = r.best_peer
        spec = ",.3f" if r.unit == "s" else ",.0f"
        mine = r.values.get("astream")
        print(f"| {r.what} ({r.unit}) | {fmt(mine, spec)} | "
              f"{f'{peer[0]} {fmt(peer[1], spec)}' if peer else '-'} | "
              f"{_times(ratio(mine, peer[1], r.higher) if peer else None)} | {fmt(r.floor, spec)} |")


def _times(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}x"


def run(args: argparse.Namespace) -> int:
    """Run the comparisons; exit code 0."""
    from astream.cli._harness import compare
    from astream.cli._harness.args import data_folder
    from astream.cli._harness.bench import Bench
    from astream.cli._harness.server import Server

    runs = args.runs if args.runs is not None else (1 if args.quick else 3)
    if runs < 1 or args.workers < 1:
        raise CommandError("--runs and --workers must be at least 1", 2)
    user = Path(args.data).resolve() if args.data else None
    if user is not None and not user.is_dir():
        raise CommandError(f"--data {args.data}: no such folder", 2)
    if user is not None:
        compare.kind_of(user)  # (what it holds, before anything starts)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    results = out / "results.jsonl"
    results.unlink(missing_ok=True)
    quiet = bool(getattr(args, "quiet", False))
    ns = argparse.Namespace(runs=runs, data=args.work or str(data_folder("compare")), json=str(results), base=None,
                            head=None, quiet=quiet, peer_python=args.peer_python, install_peers=args.install_peers)
    bench = Bench("compare", ns)
    for name in bench.pythons:
        if args.peers is not None and name not in args.peers:
            bench.pythons[name] = None
    found = [name for name, python in bench.pythons.items() if python]
    if not quiet:
        print(f"peers found: {', '.join(found) or 'none'} (--install-peers NAME to create one); load average "
              f"{os.getloadavg()[0]:.1f} on {os.cpu_count()} CPUs", file=sys.stderr)
    with Server(user.parent if user is not None else bench.data) as server:
        plan = compare.plan(bench, server, user, args.workers, args.quick)
        bench.run()
        table = compare.rows(bench, plan)
        if not args.no_accelerators and user is None:
            max_n = args.max_accelerators or (4 if args.quick else 16)
            with progress(quiet, desc="accelerators", unit="trial") as bar:
                def step(what: str) -> None:
                    bar.set_postfix_str(what)
                    bar.update()

                table += compare.accelerators(bench, server, plan, max_n, args.quick, step)
    print(f"\nastream bench compare{' --quick' if args.quick else ''}: medians of {runs} fresh process(es) per "
          f"case, load average {bench.loads()} on {os.cpu_count()} CPUs (above 1: astream better)\n")
    _print(table)
    charts: list[str] = []
    try:
        from astream.cli._harness.plot import draw

        charts = [str(p) for p in draw(table, out)]
    except ImportError:
        print("\n(no charts: pip install 'astream[plot]' for matplotlib)", file=sys.stderr)
    with results.open("a") as f:
        f.write(json.dumps({"kind": "compare", "quick": args.quick, "runs": runs, "load": bench.loads(),
                            "peers": found, "rows": [r.as_json() for r in table], "charts": charts}) + "\n")
    print(f"\nresults: {results}" + "".join(f"\nchart: {c}" for c in charts))
    return 0
