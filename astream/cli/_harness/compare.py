"""The headline comparisons of ``astream bench compare``: what runs, and the one table.

Warm epochs (~1 KB records and ~100 KB arrays, shuffled or not, 0 and N workers), cold
epochs over loopback against the transfer floor (first batch, resumption at 90 %), Parquet
and WebDataset passes, and the accelerator-utilisation search (MLPerf Storage style: the
most simulated accelerators a loader keeps >= 90 % busy), each side by side with whichever
peers are installed. Each row: astream, the faster peer, astream against it (above 1:
astream better; times inverted), and the floor where there is one.
"""

from __future__ import annotations

import importlib.util
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from astream.cli._harness import data
from astream.cli._harness.au import busy, largest
from astream.cli._harness.bench import Bench, Metric, ratio
from astream.cli._harness.server import Server

__all__ = ["PEERS_OF", "Plan", "Row", "accelerators", "plan", "rows"]

PEERS_OF = {"mds": ("mosaicml", "litdata"), "parquet": ("hf", "litdata"), "wds": ("webdataset",)}
LABELS = {"small": "~1 KB records", "large": "~100 KB arrays"}
# name: (shape, samples, shard size, AU batch, AU step seconds, AU steps); quick sizes apart
SETS = {"small": ("records", 50_000, "8mb", 64, 0.016, 100), "large": ("arrays", 1_000, "64mb", 16, 0.04, 40)}
QUICK = {"small": 4_000, "large": 160}


@dataclass
class Row:
    """One line of the table: a figure of astream and of each peer, the floor if any."""

    what: str
    unit: str
    higher: bool
    values: dict[str, float | None]
    floor: float | None = None
    chart: str = ""  # which chart draws it: throughput, cold, accelerators

    @property
    def best_peer(self) -> tuple[str, float] | None:
        got = [(s, v) for s, v in self.values.items() if s != "astream" and v is not None]
        if not got:
            return None
        return (max if self.higher else min)(got, key=lambda sv: sv[1])

    def as_json(self) -> dict[str, Any]:
        peer = self.best_peer
        return {"what": self.what, "unit": self.unit, "higher_is_better": self.higher, "values": self.values,
                "faster_peer": peer[0] if peer else None,
                "ratio": ratio(self.values.get("astream"), peer[1], self.higher) if peer else None,
                "floor": self.floor, "chart": self.chart}


@dataclass
class Plan:
    """What was added to the bench, to read the rows back."""

    folders: dict[str, Path] = field(default_factory=dict)
    warm: list[dict[str, Any]] = field(default_factory=list)
    cold: list[str] = field(default_factory=list)
    formats: list[str] = field(default_factory=list)


def _mds_cases(bench: Bench, server: Server, plan_: Plan, name: str, folder: Path, lit: Path | None,
               workers: int, quick: bool) -> None:
    for shuffle in (False, True):
        for w in (0, workers):
            if quick and shuffle and (w or name != "small"):
                continue
            config = {"group": "warm", "dataset": name, "shuffle": shuffle, "workers": w}
            plan_.warm.append(config)
            for side in ("astream", "mosaicml", "litdata"):
                local = lit if side == "litdata" else folder
                if local is not None:
                    bench.add(config, side, "mds", "stream", {"lib": side, "remote": None, "local": str(local),
                                                              "workers": w, "shuffle": shuffle})
    plan_.cold.append(name)
    resume = int(data.count(folder) * 0.9) // 32 * 32
    for group, extra in (("cold", {}), ("resume", {"resume": resume, "canonical_nodes": 1})):
        config = {"group": group, "dataset": name}
        for side in ("astream", "mosaicml"):
            remote = server.url(folder) if side == "astream" else server.s3(folder)
            bench.add(config, side, "mds", "stream", {"lib": side, "remote": remote, "local": "{cache}", **extra},
                      server.s3_env() if side == "mosaicml" else None)
    bench.add({"group": "cold", "dataset": name}, "raw", "mds", "raw", {"url": server.url(folder), "local": "{cache}"})


def _format_cases(bench: Bench, plan_: Plan, kind: str, folder: Path, total: int, repeats: int) -> None:
    plan_.formats.append(kind)
    if kind == "parquet":
        for what, sides in (("cold", ("astream", "pyarrow", "hf", "litdata")), ("resume", ("astream", "hf", "litdata"))):
            if what == "resume" and total < 0:
                continue
            for side in sides:
                bench.add({"group": "parquet", "what": what}, side, "formats", "parquet",
                          {"lib": side, "remote": str(folder), "cache": "{cache}", "what": what, "total": total,
                           "repeats": repeats})
    else:
        for side in ("astream", "webdataset"):
            bench.add({"group": "wds"}, side, "formats", "webdataset",
                      {"lib": side, "remote": str(folder), "cache": "{cache}", "what": "cold", "total": total,
                       "repeats": repeats})


def kind_of(folder: Path) -> str:
    """What a user's dataset folder holds: ``mds``, ``parquet`` or ``wds``."""
    if (folder / "index.json").is_file():
        return "mds"
    names = os.listdir(folder)
    if any(n.endswith(".parquet") for n in names):
        return "parquet"
    if any(n.endswith(".tar") for n in names):
        return "wds"
    from astream.cli._output import CommandError

    raise CommandError(f"--data {folder}: no index.json (MDS), *.parquet or *.tar files in it", 2)


def plan(bench: Bench, server: Server, user: Path | None, workers: int, quick: bool) -> Plan:
    """Add the comparisons' cases: the built datasets', or those a user's dataset allows."""
    out = Plan()
    repeats = 1 if quick else 3
    if user is not None:
        kind = kind_of(user)
        out.folders["user"] = user
        if kind == "mds":
            _mds_cases(bench, server, out, "user", user, None, workers, quick=True)
        elif kind == "parquet":
            import pyarrow.parquet as pq

            total = sum(pq.ParquetFile(user / n).metadata.num_rows for n in sorted(os.listdir(user))
                        if n.endswith(".parquet"))
            _format_cases(bench, out, "parquet", user, total if (user / "index.parquet.json").exists() else -1,
                          repeats)
        else:
            _format_cases(bench, out, "wds", user, -1, repeats)
        return out
    for name, (shape, count, limit, *_) in SETS.items():
        count = QUICK[name] if quick else count
        folder = out.folders[name] = data.mds(bench.data, name, shape, count, limit)
        lit = data.lit(bench.data, f"lit-{name}", shape, count, str(bench.pythons["litdata"])) \
            if bench.has("litdata") else None
        _mds_cases(bench, server, out, name, folder, lit, workers, quick)
    if importlib.util.find_spec("pyarrow") is not None:  # (the parquet extra)
        files, groups, rows = (2, 4, 4096) if quick else (4, 8, 32768)
        _format_cases(bench, out, "parquet", data.parquet(bench.data, "parquet", files, groups, rows),
                      files * groups * rows, repeats)
    else:
        print("no Parquet comparison: pip install 'astream[parquet]' for pyarrow", file=sys.stderr)
    tars, per = (2, 1000) if quick else (8, 4000)
    _format_cases(bench, out, "wds", data.tars(bench.data, "wds", tars, per), tars * per, repeats)
    return out


def _first(r: dict[str, Any], key: str) -> float | None:
    res = r["result"]
    if "epochs" in res:
        return float(res["epochs"][0][key]) if res["epochs"][0][key] is not None else None
    return None


def _rate(r: dict[str, Any]) -> float:
    e = r["result"]["epochs"][0]
    return float(e["samples"] / e["total_s"])


def _listed(key: str) -> Callable[[dict[str, Any]], float | None]:
    import statistics

    return lambda r: statistics.median(r["result"][key]) if r["result"].get(key) else None


def rows(bench: Bench, p: Plan) -> list[Row]:
    """The table's rows, from the runs."""
    out = []
    sides = ("astream", "mosaicml", "litdata")
    rate = Metric("samples/s", _rate)
    for c in p.warm:
        label = LABELS.get(c["dataset"], "your dataset")
        what = f"{label}, warm, {'shuffled, ' if c['shuffle'] else ''}{c['workers']} workers"
        out.append(Row(what, "samples/s", True, {s: bench.median(c, s, rate) for s in sides}, chart="throughput"))
    epoch = Metric("cold epoch s", lambda r: _first(r, "total_s"), higher=False)
    first = Metric("first batch s", lambda r: _first(r, "first_s"), higher=False)
    for name in p.cold:
        label, cold = LABELS.get(name, "your dataset"), {"group": "cold", "dataset": name}
        raw_import = bench.median(cold, "raw", Metric("", lambda r: r["result"]["import_s"]))
        transfer = bench.median(cold, "raw", epoch)
        warm = bench.median({"group": "warm", "dataset": name, "shuffle": False, "workers": 0}, "astream", epoch)
        floor = None
        if raw_import is not None and transfer is not None and warm is not None:
            floor = max(transfer - raw_import, warm) + raw_import
        first_floor = bench.median(cold, "raw", first)
        pair = ("astream", "mosaicml")
        out.append(Row(f"{label}, cold over loopback: the epoch", "s", False,
                       {s: bench.median(cold, s, epoch) for s in pair}, floor, chart="cold"))
        out.append(Row(f"{label}, cold over loopback: first batch", "s", False,
                       {s: bench.median(cold, s, first) for s in pair}, first_floor))
        out.append(Row(f"{label}, cold: resume at 90 %, first batch", "s", False,
                       {s: bench.median({"group": "resume", "dataset": name}, s, first) for s in pair}, first_floor))
    if "parquet" in p.formats:
        cfg = {"group": "parquet", "what": "cold"}
        m = Metric("rows/s", _listed("rows_per_s"))
        out.append(Row("Parquet, cold pass", "rows/s", True, {s: bench.median(cfg, s, m) for s in PEERS_OF["parquet"]
                                                               + ("astream",)},
                       bench.median(cfg, "pyarrow", m), chart="throughput"))
        cfg = {"group": "parquet", "what": "resume"}
        m = Metric("s", _listed("resume_s"), higher=False)
        if bench.values(cfg, "astream", m):
            out.append(Row("Parquet, resume at 90 %: first batch", "s", False,
                           {s: bench.median(cfg, s, m) for s in ("astream", *PEERS_OF["parquet"])}))
    if "wds" in p.formats:
        m = Metric("samples/s", _listed("rows_per_s"))
        out.append(Row("WebDataset tars, cold pass", "samples/s", True,
                       {s: bench.median({"group": "wds"}, s, m) for s in ("astream", "webdataset")}, chart="throughput"))
    for row in out:  # astream first, then the peers in a fixed order
        row.values = {k: row.values[k] for k in sorted(row.values, key=lambda s: (s != "astream", s))}
    return out


def _busy(bench: Bench, server: Server, name: str, folder: Path, side: str, n: int, quick: bool) -> bool:
    """One trial: ``n`` accelerators of ``side`` over ``folder``, cold; all >= 90 % busy?"""
    _, _, _, batch, step_s, steps = SETS[name]
    params = {"lib": side, "remote": server.url(folder) if side == "astream" else server.s3(folder),
              "local": "{cache}", "batch": batch, "workers": 1, "steps": 20 if quick else steps, "step_s": step_s}
    trial = busy(bench, {"group": "au", "dataset": name}, side, n, params,
                 server.s3_env() if side == "mosaicml" else None)
    return bool(trial["passed"])


def accelerators(bench: Bench, server: Server, p: Plan, max_n: int, quick: bool,
                 step: Callable[[str], None]) -> list[Row]:
    """The most simulated accelerators (MLPerf Storage style: rank processes of one node, each
    a shuffled loader with one worker whose loop sleeps a step time per batch) that a loader
    keeps every one >= 90 % busy, cold over loopback (:func:`largest`); ``step(what)`` is told
    of each trial."""
    out = []
    for name, folder in p.folders.items():
        if name not in SETS:
            continue
        found: dict[str, float | None] = {}
        for side in ("astream", "mosaicml"):
            if bench.has(side):
                def passes(n: int, side: str = side, name: str = name, folder: Path = folder) -> bool:
                    step(f"{side} {name} N={n}")
                    return _busy(bench, server, name, folder, side, n, quick)

                found[side] = float(largest(passes, max_n))
        out.append(Row(f"{LABELS[name]}: accelerators kept >= 90 % busy (cold, max {max_n})", "accelerators", True,
                       found, chart="accelerators"))
    return out
