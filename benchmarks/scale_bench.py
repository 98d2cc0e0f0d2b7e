"""(Internal stages: the binary index and the per-rank plan.) How start-up cost grows with the dataset and the world: measured curves, log-log charts.

Each point is a fresh process under an address-space cap (``--mem-cap-mb``, RLIMIT_AS), one
point at a time, so the largest ones fail alone instead of taking the machine down; a
peer's point that fails (out of memory under the cap, or past ``--timeout``) is said so
and left out of its curve.

- ``plan``: one rank's plan (the last rank of a 64-node x 8-rank x 8-worker world, py1e
  with MosaicML's defaults) against the epoch's samples (``--samples``, one shard per 1,000
  samples); mosaicml's ``generate_work`` builds the whole world's in every process.
- ``world``: the same at 10^8 samples against the world's nodes (``--nodes``, 8 ranks each).
- ``index``: an MDS ``index.json`` of ``--shards`` shards read by a process: ``build`` (the
  node's first process makes the binary index), ``astream`` (every other process maps it),
  ``dataset`` (a further process's whole ``StreamingDataset`` construction over it),
  ``json`` (astream's JSON reader, every process before the binary index) and mosaicml's.
- ``agent``: one node agent under ``--clients`` light client processes (72: 8 ranks x 8
  workers and their main processes), each ``ensure`` of a cached shard in a closed loop:
  p50/p99 latency, the agent's CPU per request, the slowest client's rate over the fastest's.
- ``streams``: a shuffled dataset of ``--streams`` local streams of 100 shards each:
  construction and the first batch, in a further process of the node (the first one, which
  builds each stream's binary index, is run before it and printed).

    python benchmarks/scale_bench.py --curve plan world --runs 1 --png-dir docs/bench/img
    python benchmarks/scale_bench.py --curve plan --samples 1e6 1e7 --runs 1      # a quick look
"""

from __future__ import annotations

import math
import sys
from pathlib import Path
from typing import Any

from _harness import Bench, Metric, fmt, parser

from astream.cli._harness.peers import PEERS
from astream.cli._harness.proc import ChildFailed

CPU = Metric("CPU s", lambda r: r["result"].get("cpu_seconds"), higher=False, spec=".2f")
WALL = Metric("wall s", lambda r: r["result"]["seconds"], higher=False, spec=".2f")
PEAK = Metric("peak RSS MB", lambda r: r["result"]["peak_rss_mb"], higher=False)
GROWTH = Metric("RSS growth MB", lambda r: r["result"]["rss_growth_mb"], higher=False, spec=",.1f")


def _num(text: str) -> int:
    return int(float(text.replace("_", "")))


Case = tuple[dict[str, Any], str, str, str, dict[str, Any]]  # config, side, module, function, params


def _plan_cases(bench: Bench, args: Any, curve: str) -> list[Case]:
    points: list[Case] = []
    xs = args.samples if curve == "plan" else args.nodes
    for x in xs:
        samples = x if curve == "plan" else args.world_samples
        nodes = 64 if curve == "plan" else x
        common = {"samples": samples, "shards": max(1, samples // 1000), "ncn": None, "block": None,
                  "nodes": nodes, "ranks": 8, "workers": 8, "mem_cap_mb": args.mem_cap_mb}
        points.append(({"curve": curve, "x": x}, "astream", "plans", "plan", {"lib": "astream", "what": "rank", **common}))
        if "mosaicml" in args.libs:
            points.append(({"curve": curve, "x": x}, "mosaicml", "plans", "plan",
                           {"lib": "mosaicml", "what": "work", **common}))
    return points


def _index_cases(bench: Bench, args: Any, curve: str) -> list[Case]:
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from astream.cli._harness.work.scale import synthetic_index

    points: list[Case] = []
    for shards in args.shards:
        root = str(Path(synthetic_index(str(bench.data / f"index-{shards}"), shards)).parent)
        config = {"curve": curve, "x": shards}
        # The node's first process builds the binary index; every other one maps it.
        for side, lib, what in (("build", "astream", "build"), ("astream", "astream", "attach"),
                                ("dataset", "astream", "dataset"), ("json", "astream", "json"),
                                ("mosaicml", "mosaicml", "json")):
            if side != "mosaicml" or "mosaicml" in args.libs:
                points.append((config, side, "scale", "index",
                               {"lib": lib, "what": what, "root": root, "mem_cap_mb": args.mem_cap_mb}))
    return points


CURVES = {
    "plan": ("one rank's plan against the epoch's samples (64 nodes x 8 ranks)", "samples", _plan_cases),
    "world": ("one rank's plan against the world's nodes (8 ranks each, 10^8 samples)", "nodes", _plan_cases),
    "agent": ("the node agent under N clients", "clients", None),
    "streams": ("a shuffled dataset of N local streams of 100 shards: construction and the first batch",
                "streams", None),
    "index": ("reading an index.json of N shards: astream's node build (once), attach (every other process), "
              "its JSON reader; mosaicml's", "shards", _index_cases),
}


def agent_curve(args: Any) -> None:
    """The node agent under N light clients: latency, agent CPU per request, fairness."""
    import statistics
    import time
    import uuid

    bench = Bench("scale-agent", args)
    remote = bench.data / "agent-remote"
    remote.mkdir(parents=True, exist_ok=True)
    key = "shard.00000.mds"
    (remote / key).write_bytes(b"\0" * 65536)
    rows, lat_series, cpu_series = [], {"p50": [], "p99": []}, {"agent CPU µs per request": []}
    for n in args.clients:
        start_at = time.time() + 10 + 0.8 * n  # every client imported and connected (72 at load ~10: ~40 s)
        record = bench.once({"curve": "agent", "x": n}, "astream", "scale", "agent_client",
                            {"local": "{cache}", "remote": str(remote), "run_id": f"scale-{uuid.uuid4().hex[:8]}",
                             "key": key, "start_at": start_at, "seconds": args.agent_seconds}, ranks=n)
        clients = record["result"] if n > 1 else [record["result"]]
        lat = sorted(x for c in clients for x in c["latencies_us"])
        total = sum(c["requests"] for c in clients)
        agent = max(c["agent_cpu_after"] for c in clients) - min(c["agent_cpu_before"] for c in clients)
        rates = [c["rate"] for c in clients]
        worst_p99 = max(sorted(c["latencies_us"])[int(0.99 * (len(c["latencies_us"]) - 1))] for c in clients)
        p50, p99 = lat[len(lat) // 2], lat[int(0.99 * (len(lat) - 1))]
        lat_series["p50"].append((n, p50))
        lat_series["p99"].append((n, p99))
        cpu_series["agent CPU µs per request"].append((n, agent / total * 1e6))
        rows.append([n, f"{total:,}", f"{sum(rates):,.0f}", f"{p50:,.0f}", f"{p99:,.0f}", f"{worst_p99:,.0f}",
                     f"{agent / total * 1e6:.1f}", f"{min(rates) / max(rates):.2f}",
                     f"{statistics.median(rates):,.0f}", f"{max(c['late_s'] for c in clients):.1f}"])
    bench.table(f"the node agent under N clients (each its own process, ensure of a cached shard in a closed loop, "
                f"{args.agent_seconds:g} s); load {bench.loads()}",
                ["clients", "requests", "requests/s", "p50 µs", "p99 µs", "worst client's p99 µs",
                 "agent CPU µs/request", "slowest/fastest client", "median client req/s", "latest start s"], rows)
    if args.png_dir:
        series = {"cpu": lat_series, "rss": cpu_series}
        print(f"chart: {chart('agent', 'the node agent under N clients', 'clients', series, args.png_dir, 'agent CPU µs per request', ('latency µs (all requests)', ''))}")


def streams_curve(args: Any) -> None:
    """Construction and first batch against the number of streams (hard-linked copies of
    one 100-shard dataset, made once under the data folder)."""
    sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
    from astream import MDSWriter

    bench = Bench("scale-streams", args)
    base = bench.data / "streams-base"
    if not (base / "index.json").exists():
        with MDSWriter(out=str(base), columns={"id": "int64", "x": "bytes"}, size_limit=560) as w:
            for i in range(300):  # 3 samples a shard: 100 shards
                w.write({"id": i, "x": b"a" * 100})
    rows, series = [], {"cpu": {"construction": [], "first batch": []}, "rss": {"astream": []}}
    for n in args.streams:
        # The node's first process builds each stream's binary index; the point is a further one.
        params = {"root": str(bench.data / "streams"), "base": str(base), "count": n, "mem_cap_mb": args.mem_cap_mb}
        first = bench.once({"curve": "streams-first", "x": n}, "astream", "scale", "many_streams", params)["result"]
        print(f"{n:,} streams, the node's first process: construct {first['construct_s']:.2f} s "
              f"({first['construct_cpu_s']:.2f} CPU s), first batch {first['first_batch_s']:.2f} s")
        record = bench.once({"curve": "streams", "x": n}, "astream", "scale", "many_streams", params)
        r = record["result"]
        series["cpu"]["construction"].append((n, r["construct_cpu_s"]))
        series["cpu"]["first batch"].append((n, r["first_batch_cpu_s"]))
        series["rss"]["astream"].append((n, r["peak_rss_mb"]))
        rows.append([f"{n:,}", f"{r['construct_s']:.2f}", f"{r['construct_cpu_s']:.2f}", f"{r['first_batch_s']:.2f}",
                     f"{r['first_batch_cpu_s']:.2f}", f"{r['peak_rss_mb']:,.0f}"])
    rows.append(["growth (last decade)", "-", growth(*zip(*series["cpu"]["construction"], strict=True)), "-",
                 growth(*zip(*series["cpu"]["first batch"], strict=True)), growth(*zip(*series["rss"]["astream"],
                                                                                        strict=True))])
    bench.table(f"a shuffled dataset of N local streams of 100 shards; load {bench.loads()}",
                ["streams", "construct s", "construct CPU s", "first batch s", "first batch CPU s", "peak RSS MB"],
                rows)
    if args.png_dir:
        print(f"chart: {chart('streams', 'N local streams of 100 shards', 'streams', series, args.png_dir, 'peak RSS (MB)')}")


def growth(xs: list[float], ys: list[float]) -> str:
    """The log-log slope over the curve's last decade(s): ``~x^k`` (k = 1 is linear)."""
    pairs = [(x, y) for x, y in zip(xs, ys, strict=True) if y and y > 0]
    if len(pairs) < 2:
        return "-"
    (x0, y0), (x1, y1) = pairs[-2], pairs[-1]
    return f"x^{math.log(y1 / y0) / math.log(x1 / x0):.2f}"


def chart(curve: str, title: str, xlabel: str, series: dict[str, dict[str, list[tuple[float, float]]]],
          out: Path, memory: str, first: tuple[str, str] = ("CPU seconds", "")) -> Path:
    """Two log-log panels (CPU seconds, peak RSS) with a line per library."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, axes = plt.subplots(1, 2, figsize=(10, 4))
    colors = {"astream": "#1f77b4", "mosaicml": "#ff7f0e", "build": "#2ca02c", "json": "#9467bd",
              "construction": "#1f77b4", "first batch": "#17becf", "p50": "#1f77b4", "p99": "#d62728"}
    for ax, (metric, label) in zip(axes, (("cpu", first[0]), ("rss", memory)), strict=True):
        for side, points in series[metric].items():
            if points:
                ax.plot(*zip(*points, strict=True), marker="o", label=side, color=colors.get(side))
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel(xlabel)
        ax.set_ylabel(label)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8)
    fig.suptitle(title, fontsize=10)
    fig.tight_layout()
    path = out / f"scale_{curve}.png"
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def main() -> None:
    p = parser(__doc__, "scale", libs=("astream", "mosaicml"), runs=1)
    p.add_argument("--curve", nargs="*", default=list(CURVES), choices=list(CURVES))
    p.add_argument("--samples", nargs="*", type=_num, default=[10**6, 10**7, 10**8, 10**9])
    p.add_argument("--nodes", nargs="*", type=_num, default=[1, 8, 64, 512])
    p.add_argument("--world-samples", type=_num, default=10**8)
    p.add_argument("--shards", nargs="*", type=_num, default=[10**3, 10**4, 10**5, 10**6])
    p.add_argument("--clients", nargs="*", type=_num, default=[1, 8, 32, 72])
    p.add_argument("--agent-seconds", type=float, default=5.0)
    p.add_argument("--streams", nargs="*", type=_num, default=[1, 10, 100, 1000, 10000])
    p.add_argument("--mem-cap-mb", type=int, default=8000, help="address-space cap of each point's process")
    p.add_argument("--png-dir", type=Path, help="write the log-log charts there (needs matplotlib)")
    args = p.parse_args()
    for curve in args.curve:
        title, xlabel, cases = CURVES[curve]
        if cases is None:
            agent_curve(args) if curve == "agent" else streams_curve(args)
            continue
        memory = GROWTH if curve == "index" else PEAK
        bench = Bench(f"scale-{curve}", args)
        failed: dict[tuple[str, int], str] = {}
        for config, side, module, function, params in cases(bench, args, curve):
            if not bench.has(side):
                continue
            for _ in range(bench.runs):
                try:
                    bench.once(config, side, module, function, params)
                except ChildFailed as exc:
                    if side not in PEERS:
                        raise
                    failed[(side, config["x"])] = str(exc).splitlines()[-1][:120]
                    print(f"{side} at {xlabel}={config['x']:,}: {failed[(side, config['x'])]}", file=sys.stderr)
                    break
        sides = list(dict.fromkeys(r["side"] for r in bench.records))
        rows, series = [], {"cpu": {s: [] for s in sides}, "rss": {s: [] for s in sides}}
        for config in bench.configs():
            row: list[Any] = [f"{config['x']:,}"]
            for side in sides:
                cpu, peak = bench.median(config, side, CPU), bench.median(config, side, memory)
                if cpu is None:
                    row += [f"stops: {failed.get((side, config['x']), 'not run')}", "-"]
                    continue
                series["cpu"][side].append((config["x"], cpu))
                series["rss"][side].append((config["x"], peak))
                row += [fmt(cpu, ".2f"), fmt(peak, memory.spec)]
            rows.append(row)
        rows.append(["growth (last decade)", *[g for s in sides for g in (
            growth(*zip(*series["cpu"][s], strict=True)) if len(series["cpu"][s]) > 1 else "-",
            growth(*zip(*series["rss"][s], strict=True)) if len(series["rss"][s]) > 1 else "-")]])
        bench.table(f"{title}; load {bench.loads()}", [xlabel, *[f"{s} {m}" for s in sides for m in
                                                              ("CPU s", memory.name)]], rows)
        if args.png_dir:
            args.png_dir.mkdir(parents=True, exist_ok=True)
            print(f"chart: {chart(curve, title, xlabel, series, args.png_dir, memory.name)}")


if __name__ == "__main__":
    main()
