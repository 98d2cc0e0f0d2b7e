"""``astream plan``: what an epoch will cost, from the dataset's index.json alone.

With ``--state`` and ``--stream``, the rest of a saved epoch under a new mixture instead
(:mod:`astream.cli._plan_mixture`).

Builds the epoch plan a ``StreamingDataset`` with these parameters would follow and
plays it through the cache's eviction policy (:func:`astream._sampling.forecast.forecast_epoch`):
bytes downloaded per node, peak cache, the smallest workable ``cache_limit``, the stall a
training loop would see at a bandwidth and step time, and how well batches mix shards.
``--png`` draws cache occupancy and cumulative download over the epoch (matplotlib,
extra ``plot``).
"""

from __future__ import annotations

import argparse
import json
from dataclasses import asdict
from typing import Any

from astream._dataset.depth import MAX_DEPTH, QUEUE_BYTES
from astream._format.index import Index
from astream._node.room import footprints
from astream._sampling.defaults import (
    DEFAULT_PARTITION_ALGO,
    DEFAULT_SHUFFLE_ALGO,
    DEFAULT_SHUFFLE_SEED,
    SHUFFLE_ALGOS,
)
from astream._sampling.forecast import EpochForecast, forecast_epoch
from astream._sampling.plan import EpochPlan
from astream._units import parse_bytes
from astream.cli._output import CommandError, format_size, print_table
from astream.cli._plan_mixture import add_arguments as add_mixture_arguments
from astream.cli._plan_mixture import run_remainder
from astream.cli._source import dataset_root, read_index

__all__ = ["add_parser", "forecast", "run", "transfer_sizes"]


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    """Declare ``astream plan``."""
    p = sub.add_parser(
        "plan", parents=[common], help="simulate an epoch: downloads, cache, stall, shuffle quality",
        description="Simulate one epoch of a dataset from its index.json: the real plan through the real "
                    "eviction policy. Nothing is downloaded but index.json.")
    p.add_argument("location", metavar="DATASET", nargs="?",
                   help="dataset directory, file://, http(s):// or s3:// URL (not with --state)")
    p.add_argument("--split", help="sub-folder of the dataset holding the split's index.json")
    p.add_argument("--world", default="1x1", metavar="NODESxRANKS",
                   help="physical nodes x ranks per node (default 1x1)")
    p.add_argument("--workers", type=int, default=0, help="loader workers per rank (default 0)")
    p.add_argument("--batch-size", type=int, default=None, help="samples per batch per rank (required but "
                   "with --state)")
    p.add_argument("--no-shuffle", dest="shuffle", action="store_false", help="read in order (default: shuffled)")
    p.add_argument("--shuffle-algo", default=DEFAULT_SHUFFLE_ALGO, choices=SHUFFLE_ALGOS)
    p.add_argument("--shuffle-seed", type=int, default=DEFAULT_SHUFFLE_SEED)
    p.add_argument("--shuffle-block-size", type=int, default=None)
    p.add_argument("--num-canonical-nodes", type=int, default=None)
    p.add_argument("--partition-algo", default=DEFAULT_PARTITION_ALGO)
    p.add_argument("--epoch", type=int, default=0)
    p.add_argument("--drop-last", action="store_true")
    p.add_argument("--cache-limit", default=None, help="the node's cache limit, e.g. 20gb (default: none)")
    p.add_argument("--keep-zip", action="store_true", help="the cache keeps compressed files too")
    p.add_argument("--predownload", type=int, default=None, help="samples each reader downloads ahead "
                   "(default 8 x batch size)")
    p.add_argument("--bandwidth", default=None, help="the node's download bandwidth per second, e.g. 100mb")
    p.add_argument("--step-time", type=float, default=None, help="seconds of one training step")
    p.add_argument("--latency", type=float, default=0.0, help="seconds each transfer costs beyond its bytes: "
                   "the request's round trip and installing the file (default 0)")
    p.add_argument("--png", default=None, metavar="PATH", help="draw cache and download over the epoch (matplotlib)")
    p.add_argument("--json", action="store_true", help="print the forecast as JSON")
    add_mixture_arguments(p)
    p.set_defaults(func=run)


# Options of the forecast that a --state remainder does not use, with their defaults.
_FORECAST_ONLY = {"split": None, "workers": 0, "batch_size": None, "shuffle_seed": DEFAULT_SHUFFLE_SEED,
                  "num_canonical_nodes": None, "epoch": 0, "drop_last": False, "cache_limit": None,
                  "keep_zip": False, "predownload": None, "bandwidth": None, "step_time": None, "latency": 0.0,
                  "png": None}


def transfer_sizes(index: Index) -> list[int]:
    """Bytes each shard's download moves (the stored files: compressed where they are)."""
    return [s.stored.bytes + (s.stored_meta.bytes if s.stored_meta is not None else 0) for s in index.shards]


def _size(text: str | None, name: str) -> int | None:
    if text is None:
        return None
    return parse_bytes(int(text) if text.isdigit() else text, name)  # a plain number is bytes


def _world(text: str) -> tuple[int, int]:
    nodes, sep, ranks = text.lower().partition("x")
    if not (sep and nodes.isdigit() and ranks.isdigit() and int(nodes) >= 1 and int(ranks) >= 1):
        raise CommandError(f"--world={text!r} is not NODESxRANKS with both >= 1 (e.g. 2x8)", 2)
    return int(nodes), int(ranks)


def forecast(index: Index, args: argparse.Namespace) -> EpochForecast:
    """The forecast ``run`` prints, for a parsed index and the command's arguments."""
    nodes, ranks = _world(args.world)
    if args.batch_size is None:
        raise CommandError("--batch-size is required to forecast an epoch", 2)
    if args.workers < 0 or args.batch_size < 1:
        raise CommandError("--workers must be >= 0 and --batch-size >= 1", 2)
    if args.latency < 0:
        raise CommandError(f"--latency={args.latency} must be >= 0 seconds", 2)
    if (args.bandwidth is None) != (args.step_time is None):
        raise CommandError("--bandwidth and --step-time go together (the stall forecast needs both)", 2)
    plan = EpochPlan(
        [{"shard_sizes": index.shard_sizes}], shuffle=args.shuffle, shuffle_algo=args.shuffle_algo,
        shuffle_seed=args.shuffle_seed, num_canonical_nodes=args.num_canonical_nodes,
        shuffle_block_size=args.shuffle_block_size, partition_algo=args.partition_algo, batch_size=args.batch_size,
        num_physical_nodes=nodes, ranks_per_node=ranks, workers_per_rank=max(1, args.workers), epoch=args.epoch,
    )
    sizes = footprints(index, args.keep_zip)
    bandwidth = _size(args.bandwidth, "--bandwidth")
    if bandwidth is not None and bandwidth <= 0:
        raise CommandError(f"--bandwidth={args.bandwidth!r} must be more than 0 bytes per second", 2)
    # The loader's prefetch queue holds at least 2 batches, more while they are small
    # (astream._dataset.depth): a batch weighs about its samples' raw bytes.
    raw = sum(s.raw_data.bytes for s in index.shards)
    batch_bytes = max(1, raw * args.batch_size // max(1, index.num_samples))
    depth = max(2, min(MAX_DEPTH, QUEUE_BYTES // batch_bytes))
    return forecast_epoch(
        plan, sizes, transfer_sizes(index), shard_samples=index.shard_sizes,
        cache_limit=_size(args.cache_limit, "--cache-limit"),
        predownload=args.predownload,
        bandwidth=None if bandwidth is None else float(bandwidth),
        step_time=args.step_time, latency=args.latency, queue_steps=depth, drop_last=args.drop_last,
    )


def run(args: argparse.Namespace) -> int:
    """Print the forecast (and draw it with ``--png``), or with ``--state`` the rest of the
    state's epoch under the ``--stream`` mixture; exit code 0."""
    if args.state is not None or args.stream:
        if args.location is not None or args.state is None:
            raise CommandError("--state and --stream go together, without a DATASET: the streams are the "
                               "new mixture", 2)
        unused = [f"--{name.replace('_', '-')}" for name, default in _FORECAST_ONLY.items()
                  if getattr(args, name) != default]
        if unused:
            raise CommandError(f"{', '.join(unused)} do(es) not apply with --state (the state gives the epoch, "
                               "seed and canonical nodes; the counts do not depend on batches or the cache)", 2)
        return run_remainder(args, *_world(args.world))
    if args.location is None:
        raise CommandError("give a DATASET to forecast (or --state and --stream for a changed mixture)", 2)
    index = read_index(args.location, args.split)
    result = forecast(index, args)
    if args.png:
        draw(result, args.png)
    if args.json:
        out = asdict(result)
        for node in out["nodes"]:
            node.pop("step_bytes")
            node.pop("step_cache_bytes")
        print(json.dumps({"dataset": dataset_root(args.location, args.split), **out}, indent=2))
        return 0
    limit = "none" if result.cache_limit is None else format_size(result.cache_limit)
    print(f"dataset           {dataset_root(args.location, args.split)}")
    print(f"shards            {len(index.shards):,} ({format_size(result.dataset_bytes)} in the cache)")
    print(f"cache limit       {limit} (smallest workable: {format_size(result.min_cache_limit)})")
    print(f"predownload       {result.predownload} samples per reader")
    print(f"shuffle quality   {result.shuffle_quality:.3f} (1.0: batches as mixed as a uniform draw)")
    stall = result.nodes[0].stall_s is not None
    print()
    print_table(
        ["node", "readers", "steps", "downloads", "re-downloads", "downloaded", "evictions", "peak cache",
         *(["stall", "epoch"] if stall else [])],
        [[n.node, n.readers, n.steps, n.downloads, n.redownloads, format_size(n.bytes_downloaded), n.evictions,
          format_size(n.peak_cache_bytes), *([f"{n.stall_s:.2f} s", f"{n.epoch_s:.2f} s"] if stall else [])]
         for n in result.nodes],
        right=tuple(range(1, 10)),
    )
    if args.png:
        print(f"\nwrote {args.png}")
    return 0


def draw(result: EpochForecast, path: str) -> None:
    """Cache occupancy and cumulative download over the steps of each node, as a PNG.

    Raises:
        CommandError: matplotlib is not installed.
    """
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as exc:
        raise CommandError("--png needs matplotlib: pip install 'astream[plot]'") from exc
    fig, (top, bottom) = plt.subplots(2, 1, sharex=True, figsize=(8, 6))
    for n in result.nodes:
        top.plot([b / 2**20 for b in n.step_cache_bytes], label=f"node {n.node}")
        total, cumulative = 0, []
        for b in n.step_bytes:
            total += b
            cumulative.append(total / 2**20)
        bottom.plot(cumulative, label=f"node {n.node}")
    if result.cache_limit is not None:
        top.axhline(result.cache_limit / 2**20, linestyle="--", color="grey", label="cache_limit")
    top.set_ylabel("cache (MiB)")
    bottom.set_ylabel("downloaded (MiB)")
    bottom.set_xlabel("step")
    top.legend()
    fig.tight_layout()
    fig.savefig(path)
    plt.close(fig)
