"""``astream plan --state STATE --stream LOCATION=WEIGHT ...``: the rest of an epoch under a new mixture.

What a resume with ``on_mixture_change="continue"`` would do, before running it: the state
(a ``state_dict()`` saved as JSON, or a Keras callback's record holding it under
``"astream"``) is loaded into a dataset of the streams given, and the rest of its epoch
is printed per stream: the weight, the samples the epoch has not delivered, what the
weight asks and what the stream gives (less when it runs short). Only the streams'
index files are read.
"""

from __future__ import annotations

import argparse
import json
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from astream._coord.world import World
from astream._dataset.dataset import StreamingDataset
from astream._dataset.mixture import MIXTURE_KEY
from astream._dataset.stream import Stream
from astream.cli._output import CommandError, print_table
from astream.errors import AstreamError

__all__ = ["add_arguments", "remainder", "run_remainder"]

WEIGHTS = ("proportion", "repeat", "choose")


def add_arguments(p: argparse.ArgumentParser) -> None:
    """The options of ``astream plan`` that plan a changed mixture's remainder."""
    p.add_argument("--state", default=None, metavar="PATH",
                   help="a saved state (JSON): show the rest of its epoch under the --stream mixture")
    p.add_argument("--stream", action="append", default=[], metavar="LOCATION=WEIGHT",
                   help="a stream of the new mixture with its proportion (LOCATION=0.8), or "
                        "LOCATION=repeat:2 / LOCATION=choose:500 / LOCATION alone; repeatable")
    p.add_argument("--epoch-size", default=None, help="the new mixture's epoch_size (with proportions)")


def _stream(text: str, cache: Path, k: int) -> Stream:
    where, sep, weight = text.rpartition("=")
    if not sep or "://" in weight or "/" in weight:
        where, weight = text, ""
    kind, value = "proportion", weight
    if ":" in weight:
        kind, _, value = weight.partition(":")
    if weight and kind not in WEIGHTS:
        raise CommandError(f"--stream {text!r}: the weight is a proportion (0.8), repeat:R or choose:N", 2)
    options: dict[str, Any] = {}
    if weight:
        try:
            options[kind] = int(value) if kind == "choose" else float(value)
        except ValueError:
            raise CommandError(f"--stream {text!r}: {value!r} is not a number", 2) from None
    return Stream(remote=where, local=str(cache / f"s{k}"), **options)


def _read_state(path: str) -> dict[str, Any]:
    try:
        obj = json.loads(Path(path).read_text())
    except (OSError, ValueError) as exc:
        raise CommandError(f"--state {path}: cannot read a JSON state ({exc})") from exc
    if isinstance(obj, dict) and "epoch" not in obj and isinstance(obj.get("astream"), dict):
        obj = obj["astream"]  # a Keras callback's record
    if not isinstance(obj, dict):
        raise CommandError(f"--state {path}: not a state dict (a JSON object with 'epoch', 'sample_in_epoch', ...)")
    return obj


def remainder(state_path: str, streams: Sequence[str], epoch_size: str | None, nodes: int, ranks: int,
              **sampling: Any) -> dict[str, Any]:
    """The rest of the state's epoch under the given streams, as ``stats().mixture`` says it
    (``{"changes": [], ...}`` with the plain figures when the mixture is the state's).

    ``sampling``: the dataset's ``shuffle``, ``shuffle_algo``, ``shuffle_block_size`` and
    ``partition_algo``, which a state does not record (its seed and canonical nodes it does).
    """
    if not streams:
        raise CommandError("--state needs the new mixture: one --stream LOCATION=WEIGHT per stream", 2)
    state = _read_state(state_path)
    with tempfile.TemporaryDirectory(prefix="astream-plan-") as tmp:
        try:
            world = World(rank=0, world_size=nodes * ranks, local_rank=0, ranks_per_node=ranks)
            ds = StreamingDataset(streams=[_stream(s, Path(tmp), k) for k, s in enumerate(streams)],
                                  epoch_size=epoch_size, batch_size=1, on_mixture_change="continue", world=world,
                                  run_id="plan", **sampling)
            try:
                ds.load_state_dict(state)
                report = ds.mixture_report()
                if not report:  # the state's own mixture: a plain resume
                    plan = ds.plan(epoch=int(state["epoch"]), sample_in_epoch=0, workers_per_rank=1)
                    report = {"epoch": state["epoch"], "changes": [],
                              "samples": max(plan.epoch_size - int(state["sample_in_epoch"]), 0),
                              "streams": [{"stream": s.remote, "weight": None, "unseen": None, "wanted": None,
                                           "given": None} for s in ds.streams]}
            finally:
                ds.close()
        except AstreamError as exc:
            raise CommandError(f"{type(exc).__name__}: {exc}") from exc
    report["sample_in_epoch"] = state["sample_in_epoch"]
    report["mixtures_in_state"] = len((state.get(MIXTURE_KEY) or {}).get("history") or [])
    return report


def run_remainder(args: argparse.Namespace, nodes: int, ranks: int) -> int:
    """Print the remainder (``--json``: as JSON); exit code 0."""
    report = remainder(args.state, args.stream, args.epoch_size, nodes, ranks, shuffle=args.shuffle,
                       shuffle_algo=args.shuffle_algo, shuffle_block_size=args.shuffle_block_size,
                       partition_algo=args.partition_algo)
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    changes = ", ".join(str(c) for c in report["changes"]) or "none (the state's own mixture)"
    print(f"state             epoch {report['epoch']}, {report['sample_in_epoch']:,} samples delivered")
    print(f"changes at        {changes}")
    print(f"rest of epoch     {report['samples']:,} samples")
    print()

    def cell(v: Any) -> str:
        return "-" if v is None else f"{v:,}"

    print_table(
        ["stream", "weight", "unseen", "wanted", "given"],
        [[r["stream"], "-" if not r["weight"] else " ".join(f"{k}={v}" for k, v in r["weight"].items()),
          cell(r["unseen"]), cell(r["wanted"]), cell(r["given"])] for r in report["streams"]],
        right=(2, 3, 4),
    )
    return 0
