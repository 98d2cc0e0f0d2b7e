"""One benchmark: its cases, run in fresh processes in alternating rounds, and its results
as JSON lines; medians, tables and the paired A/B against another checkout.

A *case* is one configuration (``config``, e.g. ``{"dataset": "small", "cache": "warm"}``)
read by one *side*: ``astream`` (this checkout, or ``--head``), ``base`` (``--base``: the
paired A/B), a peer (``mosaicml``, ``litdata``, ``hf``, ``webdataset``) or a floor run in
astream's interpreter (``raw``, ``pyarrow``, ...). Each round runs every case once, the
sides of a configuration in turn and in the opposite order every other round (on a shared
machine the first run of a round is slower, whichever it is).

The result format, one JSON object a line (``--json FILE`` appends them):

- ``{"kind": "machine", ...}``: when, where (CPUs, Python, platform), this checkout's commit;
- ``{"kind": "run", "bench", "config", "side", "round", "code", "result", "proc"}``: one fresh
  process (or one node's ranks): the workload's own figures (``result``) and the tree's
  (``proc``: ``wall_s``, ``cpu_s``, ``peak_rss_mb``, ``load``);
- ``{"kind": "summary", "bench", "table", "headers", "rows"}``: each table printed.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from astream.cli._harness import checkouts, peers
from astream.cli._harness.proc import ChildFailed, code_env, run_children
from astream.cli._output import CommandError, progress

__all__ = ["Bench", "Case", "Metric", "fmt", "ratio"]

ASTREAM_SIDES = ("astream", "base")


@dataclass(frozen=True)
class Metric:
    """A figure of a run: ``get(record) -> value`` (None where the run has none), and
    whether more is better (rates) or less (times, memory)."""

    name: str
    get: Callable[[dict[str, Any]], float | None]
    higher: bool = True
    spec: str = ",.0f"  # how a value prints


@dataclass
class Case:
    """What one side of one configuration runs: ``module.function(**params)`` of the
    workloads, in ``ranks`` processes started together. In a parameter, ``{cache}`` stands for
    a fresh, empty folder for each run (shared by its ranks) and ``{run}`` for the run's own
    folder (its ``TMPDIR``), both removed afterwards; ``env`` is added to the environment."""

    config: dict[str, Any]
    side: str
    module: str
    function: str
    params: dict[str, Any]
    env: dict[str, str] = field(default_factory=dict)
    ranks: int = 1


def fmt(value: float | None, spec: str = ",.0f") -> str:
    return "-" if value is None or value != value else format(value, spec)


def ratio(a: float | None, b: float | None, higher: bool = True) -> float | None:
    """How much better ``a`` is than ``b``: ``a / b`` for a rate, ``b / a`` for a time."""
    if a is None or b is None or not a or not b:
        return None
    return a / b if higher else b / a


class Bench:
    """The cases of one benchmark, their runs and their results."""

    def __init__(self, name: str, args: argparse.Namespace) -> None:
        self.name = name
        self.runs: int = args.runs
        self.quiet = bool(getattr(args, "quiet", False))
        self.data = Path(args.data)
        self.data.mkdir(parents=True, exist_ok=True)
        # The runs' caches and TMPDIRs: in the temp dir, whose short path leaves room for the
        # Unix sockets made under TMPDIR (a data folder can be deep).
        self.scratch = Path(tempfile.mkdtemp(prefix=f"astream-{name}-"))
        self.pycache = str(self.data / "pycache")
        self.codes = {"astream": checkouts.resolve(args.head, self.data.parent) if args.head else checkouts.THIS}
        if args.base:
            self.codes["base"] = checkouts.resolve(args.base, self.data.parent)
        given = dict(getattr(args, "peer_python", None) or [])
        self.pythons: dict[str, str | None] = {}
        for peer in peers.PEERS:
            found = peers.find(peer, given)
            if found is None and peer in (getattr(args, "install_peers", None) or ()):
                found = peers.create(peer)
            self.pythons[peer] = found
        self.cases: list[Case] = []
        self.records: list[dict[str, Any]] = []
        self._json: str | None = getattr(args, "json", None)
        self._write({"kind": "machine", "bench": name, "time": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
                     "cpus": os.cpu_count(), "python": sys.version.split()[0], "platform": platform.platform(),
                     "load": os.getloadavg(), "codes": self.codes, "commit": self._commit()})

    @staticmethod
    def _commit() -> str | None:
        """This checkout's commit (None for an installed package, or without git)."""
        try:
            done = subprocess.run(["git", "-C", checkouts.THIS, "rev-parse", "--short", "HEAD"],
                                  capture_output=True, text=True, check=False)
        except OSError:
            return None
        return done.stdout.strip() or None

    def _write(self, obj: dict[str, Any]) -> None:
        if self._json is not None:
            with open(self._json, "a") as f:  # a line at a time: what ran is kept if a later run fails
                f.write(json.dumps(obj) + "\n")

    def has(self, side: str) -> bool:
        """Whether ``side`` can run: a peer's interpreter was found, the base was given."""
        if side in peers.PEERS:
            return self.pythons[side] is not None
        return side in self.codes or side not in ASTREAM_SIDES

    def add(self, config: dict[str, Any], side: str, module: str, function: str, params: dict[str, Any],
            env: dict[str, str] | None = None, ranks: int = 1) -> None:
        """Add a case (skipped where its side cannot run); an ``astream`` case gets its
        ``base`` twin when a base was given."""
        for s in (side, "base") if side == "astream" and "base" in self.codes else (side,):
            if self.has(s):
                self.cases.append(Case(dict(config), s, module, function, dict(params), dict(env or {}), ranks))

    def _launch(self, case: Case, round_: int) -> dict[str, Any]:
        self.scratch.mkdir(exist_ok=True)
        run_dir = Path(tempfile.mkdtemp(prefix=f"{case.side}-", dir=self.scratch))
        cache = run_dir / "cache"
        cache.mkdir()
        params = {k: v.replace("{cache}", str(cache)).replace("{run}", str(run_dir)) if isinstance(v, str) else v
                  for k, v in case.params.items()}
        root = self.codes.get(case.side, self.codes["astream"]) if case.side not in peers.PEERS else None
        python = self.pythons.get(case.side) or sys.executable
        base_env = code_env({**os.environ, **case.env, "TMPDIR": str(run_dir)}, root, self.pycache)
        envs = [base_env] if case.ranks == 1 else [
            {**base_env, "RANK": str(r), "WORLD_SIZE": str(case.ranks), "LOCAL_RANK": str(r),
             "LOCAL_WORLD_SIZE": str(case.ranks), "ASTREAM_RUN_ID": f"{self.name}-{run_dir.name}",
             "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(20000 + (os.getpid() + len(self.records)) % 20000)}
            for r in range(case.ranks)]
        what = f"{self.name} {case.side} {case.config}"
        try:
            results, figures = run_children(python, case.module, case.function, params, envs,
                                            root or str(run_dir), what)
        finally:
            shutil.rmtree(run_dir, ignore_errors=True)
        code = results[0].get("code")
        if root is not None and case.side in ASTREAM_SIDES and code != root:
            raise CommandError(f"{what}: imported astream from {code}, not {root}: the paired A/B would compare "
                               "the wrong code (is another astream installed non-editable?)")
        record = {"kind": "run", "bench": self.name, "config": case.config, "side": case.side, "round": round_,
                  "code": code, "result": results[0] if case.ranks == 1 else results, "proc": figures}
        self._write(record)
        return record

    def once(self, config: dict[str, Any], side: str, module: str, function: str, params: dict[str, Any],
             env: dict[str, str] | None = None, ranks: int = 1) -> dict[str, Any]:
        """Run one case now (a step of a search, such as the accelerators'; not one of
        :meth:`run`'s cases); its record."""
        case = Case(dict(config), side, module, function, dict(params), dict(env or {}), ranks)
        record = self._launch(case, 0)
        self.records.append(record)
        shutil.rmtree(self.scratch, ignore_errors=True)
        return record

    def run(self) -> list[dict[str, Any]]:
        """Run every case ``runs`` times, in rounds; returns (and keeps) the run records."""
        groups: dict[str, list[Case]] = {}
        for case in self.cases:
            groups.setdefault(json.dumps(case.config, sort_keys=True), []).append(case)
        try:
            with progress(self.quiet, total=len(self.cases) * self.runs, unit="run", desc=self.name) as bar:
                for r in range(self.runs):
                    for cases in groups.values():
                        for case in cases if r % 2 == 0 else cases[::-1]:
                            bar.set_postfix_str(f"{case.side} {' '.join(str(v) for v in case.config.values())}")
                            try:
                                self.records.append(self._launch(case, r))
                            except ChildFailed as exc:
                                if case.side in ASTREAM_SIDES:
                                    raise
                                # A peer's own failure (a version's quirk) leaves its cell empty,
                                # not the whole run.
                                print(f"\n{str(exc).splitlines()[0]}: left out", file=sys.stderr)
                            bar.update()
        finally:
            shutil.rmtree(self.scratch, ignore_errors=True)
        return self.records

    # -- reading the results ---------------------------------------------------------------
    def configs(self) -> list[dict[str, Any]]:
        """The configurations, in the order they were added (those run by :meth:`once` after)."""
        seen: dict[str, dict[str, Any]] = {}
        for config in [c.config for c in self.cases] + [r["config"] for r in self.records]:
            seen.setdefault(json.dumps(config, sort_keys=True), config)
        return list(seen.values())

    def values(self, config: dict[str, Any], side: str, metric: Metric) -> list[float]:
        got = (metric.get(r) for r in self.records if r["side"] == side and r["config"] == config)
        return [float(v) for v in got if v is not None]

    def median(self, config: dict[str, Any], side: str, metric: Metric) -> float | None:
        values = self.values(config, side, metric)
        return statistics.median(values) if values else None

    def loads(self) -> str:
        loads = [r["proc"]["load"] for r in self.records]
        return f"{min(loads):.1f}-{max(loads):.1f}" if loads else "-"

    def table(self, title: str, headers: Sequence[str], rows: Sequence[Sequence[Any]]) -> None:
        """Print a markdown table (and write it as a summary line)."""
        print(f"\n{title}\n")
        print("| " + " | ".join(headers) + " |")
        print("|" + "|".join("---" if i == 0 else "---:" for i in range(len(headers))) + "|")
        for row in rows:
            print("| " + " | ".join(str(c) for c in row) + " |")
        self._write({"kind": "summary", "bench": self.name, "table": title, "headers": list(headers),
                     "rows": [[str(c) for c in row] for row in rows]})

    def report_ab(self, metrics: Sequence[Metric]) -> None:
        """The paired A/B: per configuration and figure, both medians, astream against base
        (above 1: better), and the median of the rounds' own ratios (each round's two
        processes ran back to back, under the same load)."""
        rows = []
        for config in self.configs():
            for m in metrics:
                a, b = self.median(config, "astream", m), self.median(config, "base", m)
                if a is None or b is None:
                    continue
                paired = []
                for r in range(self.runs):
                    pa = [m.get(x) for x in self.records if x["round"] == r and x["config"] == config
                          and x["side"] == "astream"]
                    pb = [m.get(x) for x in self.records if x["round"] == r and x["config"] == config
                          and x["side"] == "base"]
                    one = ratio(pa[0], pb[0], m.higher) if pa and pb else None
                    if one is not None:
                        paired.append(one)
                rows.append([" ".join(f"{k}={v}" for k, v in config.items()), m.name, fmt(b, m.spec),
                             fmt(a, m.spec), fmt(ratio(a, b, m.higher), ".3f") + "x",
                             fmt(statistics.median(paired) if paired else None, ".3f") + "x"])
        self.table(f"paired A/B, {self.runs} rounds, load {self.loads()}: base {self.codes['base']}, "
                   f"astream {self.codes['astream']} (astream vs base above 1: better)",
                   ["configuration", "figure", "base", "astream", "astream vs base", "paired (median of rounds)"],
                   rows)
