"""How close ``astream plan``'s stall forecast comes to a real run (issue #20). Results: docs/bench/forecast.md.

One rank (a ``Loader`` without workers), a shuffled dataset behind the loopback HTTP
server throttled to ``--bandwidth`` bytes/s (one link shared by all responses), a
training loop that sleeps ``--step-time`` per batch. For each configuration (cache limit,
predownload) the run reports the seconds the loop waited in ``next()`` (``loader.stats()``),
the forecast from index.json alone (:func:`astream.cli._plan.forecast`, the same code as
``astream plan``), their ratio, and the transfers of both (equal when there is no
prefetch beyond the current batch). The forecast's ``--latency`` (what a transfer costs
beyond its bytes) is calibrated first by an unthrottled run. The target: the forecast
within 25% of the run.

Usage::

    python benchmarks/forecast_bench.py [--samples 3000] [--sample-kb 2] [--shard-kb 64] [--batch 16]
                                        [--bandwidth 4mb] [--step-time 0.004] [--runs 3] [--json out.json]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

from astream import Loader, MDSWriter, StreamingDataset
from astream._dataset.cache_room import footprints
from astream._format.index import Index
from astream._sampling.defaults import resolve_predownload
from astream._units import parse_bytes
from astream.cli import build_parser
from astream.cli._plan import forecast
from astream.errors import CacheWarning
from astream.testing import LoopbackServer


def write(root: Path, samples: int, sample_kb: float, shard_kb: int) -> Index:
    n = int(sample_kb * 1024)
    with MDSWriter(out=str(root), columns={"id": "int64", "x": "bytes"}, size_limit=f"{shard_kb}kb") as w:
        for i in range(samples):
            w.write({"id": i, "x": os.urandom(n)})
    return Index.load(root / "index.json")


def one_run(server: LoopbackServer, cache: str, limit: int | None, predownload: int, args: argparse.Namespace) -> Any:
    ds = StreamingDataset(remote=server.url, local=cache, batch_size=args.batch, shuffle=True, shuffle_seed=11,
                          cache_limit=limit, predownload=predownload)
    before = len(server.log)
    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", CacheWarning)
        loader = Loader(ds)
        for _ in loader:
            time.sleep(args.step_time)  # the simulated training step
        stats = loader.stats()
    wall = time.perf_counter() - start
    ds.close()
    gets = sum(1 for r in server.log[before:] if r.method == "GET" and ".mds" in r.path and r.range is None)
    return stats, wall, gets


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--samples", type=int, default=3000)
    p.add_argument("--sample-kb", type=float, default=2)
    p.add_argument("--shard-kb", type=int, default=64)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--bandwidth", default="4mb")
    p.add_argument("--step-time", type=float, default=0.004)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--json", default=None)
    args = p.parse_args()
    bandwidth = parse_bytes(args.bandwidth, "--bandwidth")
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp) / "remote"
        index = write(root, args.samples, args.sample_kb, args.shard_kb)
        total = sum(footprints(index, False))
        default_ahead = resolve_predownload(None, args.batch)
        configs = [("none", None, default_ahead), ("0.5", total // 2, args.batch), ("0.5", total // 2, default_ahead),
                   ("0.25", total // 4, args.batch)]
        # The cost of a transfer beyond its bytes on this machine (request, install: the
        # server, client and cache share its 2 cores): an unthrottled run with the tightest
        # limit, its wait divided by its transfers.
        with LoopbackServer(str(root)) as server:
            stats, _, got = one_run(server, os.path.join(tmp, "calibrate"), configs[-1][1], args.batch, args)
        latency = stats.consumer_wait_s / max(1, got)
        print(f"calibration: {got} transfers unthrottled, waited {stats.consumer_wait_s:.2f} s: "
              f"latency {latency * 1e3:.2f} ms per transfer", flush=True)
        with LoopbackServer(str(root), bandwidth=bandwidth) as server:
            for name, limit, ahead in configs:
                extra = ["--predownload", str(ahead), "--bandwidth", str(bandwidth), "--step-time", str(args.step_time),
                         "--latency", str(latency)]
                if limit is not None:
                    extra += ["--cache-limit", str(limit)]
                cli = build_parser().parse_args(["plan", server.url, "--batch-size", str(args.batch),
                                                 "--shuffle-seed", "11", *extra])
                predicted = forecast(index, cli).nodes[0]
                waits, walls, gets = [], [], []
                for run in range(args.runs):
                    stats, wall, got = one_run(server, os.path.join(tmp, f"cache-{name}-{ahead}-{run}"), limit, ahead,
                                               args)
                    waits.append(stats.consumer_wait_s)
                    walls.append(wall)
                    gets.append(got)
                wait = statistics.median(waits)
                assert predicted.stall_s is not None
                assert predicted.epoch_s is not None
                row = {"limit": name, "predownload": ahead, "measured_stall_s": wait, "runs": waits,
                       "predicted_stall_s": predicted.stall_s, "ratio": predicted.stall_s / wait,
                       "measured_epoch_s": statistics.median(walls), "predicted_epoch_s": predicted.epoch_s,
                       "downloads": gets, "predicted_downloads": predicted.downloads}
                row["latency_s"] = latency
                rows.append(row)
                print(f"limit {name:>4} predownload {ahead:4d}: stall measured {wait:6.2f} s "
                      f"(runs {', '.join(f'{w:.2f}' for w in waits)}), predicted {predicted.stall_s:6.2f} s, "
                      f"ratio {row['ratio']:.2f}; epoch {row['measured_epoch_s']:.2f} s vs {predicted.epoch_s:.2f} s; "
                      f"downloads {gets} vs {predicted.downloads}", flush=True)
    print(f"dataset {args.samples} x {args.sample_kb} KB in {len(index.shards)} shards ({total / 2**20:.1f} MiB), "
          f"batch {args.batch}, bandwidth {bandwidth / 2**20:.1f} MiB/s, step {args.step_time * 1e3:.1f} ms")
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
