"""How close ``astream plan``'s stall forecast comes to a real run (issue 20). Results: docs/bench/forecast.md.

One rank (a ``Loader`` without workers), a shuffled dataset behind the loopback server
throttled to ``--bandwidth`` bytes/s (one link shared by all responses), a training loop
that sleeps ``--step-time`` a batch. For each configuration (cache limit, predownload) the
run reports the seconds the loop waited in ``next()`` (``loader.stats()``), the forecast of
``astream plan --json`` from index.json alone, their ratio, and both epochs' downloads. The
forecast's ``--latency`` (what a transfer costs beyond its bytes on this machine) is
calibrated first by an unthrottled run: its wait over its transfers. The target: the
forecast within 25 % of the run.

    python benchmarks/forecast_bench.py --runs 3
    python benchmarks/forecast_bench.py --samples 3000 --batch 16 --bandwidth 4000000 --step-time 0.004
"""

from __future__ import annotations

import contextlib
import io
import json
from typing import Any

from _harness import Bench, Metric, Server, data, fmt, parser

from astream.cli import main as cli

WAIT = Metric("stall s", lambda r: r["result"]["wait_s"], higher=False, spec=".2f")


def forecast(url: str, batch: int, limit: int | None, ahead: int, args: Any, latency: float) -> dict[str, Any]:
    """``astream plan URL --json`` with the run's settings: node 0's forecast."""
    argv = ["-q", "plan", url, "--batch-size", str(batch), "--shuffle-seed", "11", "--predownload", str(ahead),
            "--bandwidth", str(args.bandwidth), "--step-time", str(args.step_time), "--latency", str(latency), "--json"]
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        if cli([*argv, *(["--cache-limit", str(limit)] if limit else [])]):
            raise RuntimeError(f"astream {' '.join(argv)} failed")
    return dict(json.loads(out.getvalue())["nodes"][0])


def main() -> None:
    p = parser(__doc__, "forecast")
    p.add_argument("--samples", type=int, default=3000)
    p.add_argument("--shard-kb", type=int, default=64)
    p.add_argument("--batch", type=int, default=16)
    p.add_argument("--step-time", type=float, default=0.004)
    args = p.parse_args()
    args.bandwidth = args.bandwidth or 4 * 2**20
    bench = Bench("forecast", args)
    folder = data.mds(bench.data, "blobs", "blobs", int(args.samples * args.scale), f"{args.shard_kb}kb")
    total, ahead = data.stored_bytes(folder), 8 * args.batch  # (MosaicML's default predownload)
    configs = [("none", None, ahead), ("0.5", total // 2, args.batch), ("0.5", total // 2, ahead),
               ("0.25", total // 4, args.batch)]

    def params(url: str, limit: int | None, predownload: int) -> dict[str, Any]:
        return {"remote": url, "local": "{cache}", "batch": args.batch, "step_s": args.step_time, "seed": 11,
                "cache_limit": limit, "predownload": predownload}

    with Server(bench.data) as server:  # unthrottled: the latency of a transfer
        r = bench.once({"limit": "calibration"}, "astream", "mds", "train", params(server.url(folder), total // 4,
                                                                                    args.batch))
    latency = r["result"]["wait_s"] / max(1, r["result"]["downloads"])
    with Server(bench.data, args.bandwidth) as server:
        url = server.url(folder)
        for name, limit, predownload in configs:
            bench.add({"limit": name, "predownload": predownload}, "astream", "mds", "train",
                      params(url, limit, predownload))
        bench.run()
        rows = []
        for (name, limit, predownload), config in zip(configs, bench.configs(), strict=False):
            predicted = forecast(url, args.batch, limit, predownload, args, latency)
            wait = bench.median(config, "astream", WAIT)
            downloads = bench.values(config, "astream", Metric("", lambda r: r["result"]["downloads"]))
            epoch = bench.median(config, "astream", Metric("", lambda r: r["result"]["epoch_s"]))
            rows.append([name, predownload, fmt(wait, ".2f"), fmt(predicted["stall_s"], ".2f"),
                         fmt(predicted["stall_s"] / wait if wait else None, ".2f"), fmt(epoch, ".2f"),
                         fmt(predicted["epoch_s"], ".2f"), ", ".join(f"{d:.0f}" for d in downloads),
                         predicted["downloads"]])
    bench.table(f"{data.count(folder)} x 2 KB in {args.shard_kb} KB shards ({total / 2**20:.1f} MiB), batch "
                f"{args.batch}, {args.bandwidth / 2**20:.1f} MiB/s, step {args.step_time * 1e3:.1f} ms, latency "
                f"{latency * 1e3:.2f} ms a transfer; medians of {args.runs}, load {bench.loads()}",
                ["cache limit", "predownload", "stall s", "forecast s", "forecast / run", "epoch s",
                 "forecast epoch s", "downloads", "forecast downloads"], rows)


if __name__ == "__main__":
    main()
