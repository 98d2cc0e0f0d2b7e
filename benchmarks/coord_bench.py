"""Internal floor (the node agent's own client, astream._coord): per-node coordination's overhead, issue 5.

Three measurements, medians of ``--runs`` interleaved rounds (docs/bench/coord.md):

1. ``ensure`` latency of a shard already in the cache, one client, over the socket
   (target: median < 200 µs);
2. ``--ranks`` ranks reading a warm cache through the agent against the same ranks reading the
   files directly (target: >= 90 %): one ``ensure(pin=True)`` round trip per shard, and a
   loader's way, ``ensure_many`` of the next ``--window`` shards at once. Wall-clock MB/s and
   MB per CPU-second (readers + agent), which a shared machine disturbs least;
3. the busy leader: the readers through the agent (small shards: one round trip per 256 KiB)
   while the leader spins in pure Python, against the same spin in a process that is not the
   leader (target: <= 10 % slowdown), and with the agent on a thread of the spinning leader.

    python benchmarks/coord_bench.py --runs 5 --ranks 8
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import statistics
import sys
import tempfile
import time
import uuid
from dataclasses import replace
from pathlib import Path
from typing import Any

from _harness import Bench
from _harness import parser as harness_parser

from astream._coord.client import AsyncNodeClient
from astream._coord.config import CoordConfig
from astream._coord.launch import new_event_loop
from astream._coord.world import World
from astream.cli._harness.work import cpu_s as _cpu

# The tests' whole-file fetcher, imported by the name agent processes unpickle it by
# (their PYTHONPATH is the repository root).
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from tests.coord.simple_provider import SimpleProviderFactory

CONFIG = CoordConfig(agent_linger=0.5, watch_warn_after=60.0)


# -- roles run in subprocesses ----------------------------------------------------------


def _read(path: str) -> int:
    with open(path, "rb", buffering=0) as f:
        size = 0
        while chunk := f.read(1 << 20):
            size += len(chunk)
        return size


async def reader(spec: dict[str, Any]) -> dict[str, Any]:
    """Read every shard ``passes`` times, directly or through the agent; time it."""
    keys: list[str] = spec["keys"]
    config = CoordConfig(**spec["config"])
    node = None
    if spec["mode"] != "direct":
        world = World(rank=spec["rank"], world_size=spec["ranks"], local_rank=spec["rank"], ranks_per_node=spec["ranks"])
        node = AsyncNodeClient(spec["local"], SimpleProviderFactory(spec["remote"], spec["local"]),
                               run_id=spec["run_id"], world=world, config=config)
        await node.aconnect()
    await asyncio.sleep(max(0.0, spec["start_at"] - time.time()))
    start, cpu = time.time(), _cpu()
    total = 0
    for _ in range(spec["passes"]):
        if node is None:
            for key in keys:
                total += _read(os.path.join(spec["local"], key))
        elif spec["mode"] == "agent":
            for key in keys:
                async with node.pinned(key) as path:
                    total += _read(path)
        else:  # agent-window: pin the next `window` shards in one round trip, as a loader walking its plan
            for i in range(0, len(keys), spec["window"]):
                window = keys[i : i + spec["window"]]
                for key, path in zip(window, await node.ensure_many(window, pin=True), strict=True):
                    total += _read(path)
                    await node.unpin(key)
    end, cpu = time.time(), _cpu() - cpu
    if node is not None:
        await node.aclose()
    return {"bytes": total, "start": start, "end": end, "cpu": cpu}


async def spinner(spec: dict[str, Any]) -> dict[str, Any]:
    """Join the node (as leader if first), then spin in pure Python until ``stop_at``."""
    config = CoordConfig(**spec["config"])
    node = AsyncNodeClient(spec["local"], SimpleProviderFactory(spec["remote"], spec["local"]),
                           run_id=spec["run_id"], world=World(), member="spinner", config=config)
    await node.aconnect()
    print(json.dumps({"joined": True, "leader": node.started_agents > 0}), flush=True)
    await asyncio.sleep(max(0.0, spec["start_at"] - time.time()))
    loops = 0
    while time.time() < spec["stop_at"]:
        sum(range(2000))  # holds the GIL
        loops += 1
    await node.aclose()
    return {"loops": loops}


def role_main(role: str, spec: dict[str, Any]) -> None:
    loop = new_event_loop()
    try:
        result = loop.run_until_complete(reader(spec) if role == "reader" else spinner(spec))
    finally:
        loop.close()
    print(json.dumps(result), flush=True)


# -- orchestration ----------------------------------------------------------------------


async def spawn(role: str, spec: dict[str, Any]) -> asyncio.subprocess.Process:
    return await asyncio.create_subprocess_exec(sys.executable, __file__, "--role", role, json.dumps(spec),
                                                stdout=asyncio.subprocess.PIPE)


async def last_json(proc: asyncio.subprocess.Process) -> dict[str, Any]:
    out, _ = await proc.communicate()
    result: dict[str, Any] = json.loads(out.decode().strip().splitlines()[-1])
    return result


def make_dataset(root: Path, shards: int, shard_mb: float) -> list[str]:
    (root / "remote").mkdir()
    keys = [f"shard.{i:05d}.mds" for i in range(shards)]
    for key in keys:
        (root / "remote" / key).write_bytes(os.urandom(int(shard_mb * (1 << 20))))
    return keys


async def warm(local: str, remote: str, run_id: str, keys: list[str]) -> None:
    async with AsyncNodeClient(local, SimpleProviderFactory(remote, local), run_id=run_id, world=World(),
                               member="warmer", config=CONFIG) as node:
        for key in keys:
            await node.ensure(key)
    for key in keys:  # and into the page cache
        _read(os.path.join(local, key))


async def ensure_latency(local: str, remote: str, key: str, calls: int) -> float:
    async with AsyncNodeClient(local, SimpleProviderFactory(remote, local), run_id=f"lat-{uuid.uuid4().hex[:8]}",
                               world=World(), config=CONFIG) as node:
        await node.ensure(key)
        for _ in range(200):
            await node.ensure(key)
        samples = []
        for _ in range(calls):
            t = time.perf_counter()
            await node.ensure(key)
            samples.append(time.perf_counter() - t)
    return statistics.median(samples) * 1e6


async def readers_run(args: argparse.Namespace, root: Path, keys: list[str], mode: str, *, passes: int,
                      spin: str | None = None, agent_mode: str = "process") -> dict[str, float]:
    """Run ``args.ranks`` readers at once; ``spin``: None, "leader" or "follower".

    Returns the aggregate wall-clock MB/s, and MB per CPU-second (readers + agent), which
    a machine shared with other jobs disturbs much less.
    """
    local, remote = str(root / "cache"), str(root / "remote")
    run_id = f"bench-{uuid.uuid4().hex[:8]}"
    config = replace(CONFIG, agent_mode=agent_mode)  # type: ignore[arg-type]
    start_at = time.time() + 1.5 + args.ranks * 0.15
    base = {"local": local, "remote": remote, "run_id": run_id, "config": _cfg(config), "ranks": args.ranks,
            "passes": passes, "start_at": start_at, "window": args.window}
    hold = None
    spin_proc = None
    if spin is not None:
        spin_proc = await spawn("spinner", {**base, "stop_at": start_at + 600})
        if spin == "follower":  # this idle process must be the leader: wait, then spin
            await asyncio.sleep(0)
    if mode != "direct":
        # joins first unless the spinner must lead; watches the agent's CPU time
        if spin == "leader":
            assert spin_proc is not None
            assert spin_proc.stdout is not None
            joined = json.loads(await spin_proc.stdout.readline())
            assert joined["leader"], joined
        hold = AsyncNodeClient(local, SimpleProviderFactory(remote, local), run_id=run_id, world=World(),
                               member="holder", config=config)
        await hold.aconnect()
        if spin == "follower":
            assert spin_proc is not None
            assert spin_proc.stdout is not None
            joined = json.loads(await spin_proc.stdout.readline())
            assert not joined["leader"] or hold.started_agents == 0, joined
    agent_cpu = (await hold.stats())["cpu_s"] if hold is not None else 0.0
    procs = [
        await spawn("reader", {**base, "rank": r, "mode": mode, "keys": keys[r % len(keys):] + keys[: r % len(keys)]})
        for r in range(args.ranks)
    ]
    results = [await last_json(p) for p in procs]
    if hold is not None:
        agent_cpu = (await hold.stats())["cpu_s"] - agent_cpu
    if spin_proc is not None:
        spin_proc.kill()
        await spin_proc.wait()
    if hold is not None:
        await hold.aclose()
    total = sum(r["bytes"] for r in results)
    wall = max(r["end"] for r in results) - min(r["start"] for r in results)
    cpu = sum(r["cpu"] for r in results) + (agent_cpu if agent_mode == "process" else 0.0)
    return {"mb_s": round(total / wall / 1e6, 1), "mb_per_cpu_s": round(total / cpu / 1e6, 1)}


def _cfg(config: CoordConfig) -> dict[str, Any]:
    return {k: getattr(config, k) for k in config.__dataclass_fields__}


def summarize(runs: dict[str, list[dict[str, float]]], ensure_us: list[float]) -> dict[str, Any]:
    """Medians, and medians of per-round ratios (the scenarios of a round run back to back, so
    a ratio within a round cancels most of a shared machine's drift); a pair not run is left out."""
    def paired(a: str, b: str, metric: str) -> float | None:
        if not runs.get(a) or not runs.get(b):
            return None
        return round(statistics.median(x[metric] / y[metric] for x, y in zip(runs[a], runs[b], strict=True)), 3)

    pairs = {"agent_vs_direct": ("agent", "direct"), "agent_window_vs_direct": ("agent_window", "direct"),
             "busy_leader": ("small_spin_leader", "small_spin_follower"),
             "busy_thread_agent": ("small_spin_leader_thread_agent", "small_spin_follower"),
             "any_spinner": ("small_spin_follower", "small_no_spin")}
    summary: dict[str, Any] = {"ensure_median_us": statistics.median(ensure_us)}
    for name, (a, b) in pairs.items():
        for metric in ("mb_s", "mb_per_cpu_s"):
            summary[f"{name} ({metric})"] = paired(a, b, metric)
    return {"median_mb_s": {k: statistics.median(r["mb_s"] for r in v) for k, v in runs.items()},
            "median_mb_per_cpu_s": {k: statistics.median(r["mb_per_cpu_s"] for r in v) for k, v in runs.items()},
            "summary": {k: v for k, v in summary.items() if v is not None}}


async def main(args: argparse.Namespace) -> dict[str, Any]:
    results: dict[str, Any] = {"args": {k: str(v) for k, v in vars(args).items()}, "cpus": os.cpu_count()}
    with tempfile.TemporaryDirectory(prefix="coordbench") as tmp:
        big, small = Path(tmp) / "big", Path(tmp) / "small"
        big.mkdir()
        small.mkdir()
        big_keys = make_dataset(big, args.shards, args.shard_mb)
        small_keys = make_dataset(small, args.small_shards, args.small_shard_mb)
        for root, keys in ((big, big_keys), (small, small_keys)):
            await warm(str(root / "cache"), str(root / "remote"), "warm", keys)
        results["ensure_us"] = [
            round(await ensure_latency(str(big / "cache"), str(big / "remote"), big_keys[0], args.calls), 1)
            for _ in range(args.runs)
        ]
        print("ensure median µs per run:", results["ensure_us"], flush=True)
        scenarios: dict[str, tuple[Path, list[str], dict[str, Any]]] = {
            # 2: throughput of a warm cache, big shards
            "direct": (big, big_keys, {"mode": "direct"}),
            "agent": (big, big_keys, {"mode": "agent"}),
            "agent_window": (big, big_keys, {"mode": "agent-window"}),
            # 3: busy leader, small shards (one agent round trip per 256 KiB stresses the agent)
            "small_no_spin": (small, small_keys, {"mode": "agent"}),
            "small_spin_follower": (small, small_keys, {"mode": "agent", "spin": "follower"}),
            "small_spin_leader": (small, small_keys, {"mode": "agent", "spin": "leader"}),
            "small_spin_leader_thread_agent": (small, small_keys, {"mode": "agent", "spin": "leader",
                                                                    "agent_mode": "thread"}),
        }
        if args.only:
            scenarios = {k: v for k, v in scenarios.items() if k in args.only.split(",")}
        runs: dict[str, list[dict[str, float]]] = {name: [] for name in scenarios}
        for i in range(args.runs):  # interleaved, so drift on a shared machine hits all alike
            for name, (root, keys, kw) in scenarios.items():
                passes = args.small_passes if root is small else args.passes
                runs[name].append(await readers_run(args, root, keys, passes=passes, **kw))
            print(f"run {i + 1}:", {k: v[-1] for k, v in runs.items()}, flush=True)
    results["runs"] = runs
    results.update(summarize(runs, results["ensure_us"]))
    return results


if __name__ == "__main__":
    if len(sys.argv) > 2 and sys.argv[1] == "--role":
        role_main(sys.argv[2], json.loads(sys.argv[3]))
        sys.exit(0)
    parser = harness_parser(__doc__, "coord", runs=5)
    parser.add_argument("--ranks", type=int, default=8)
    parser.add_argument("--shards", type=int, default=16)
    parser.add_argument("--shard-mb", type=float, default=16.0)
    parser.add_argument("--passes", type=int, default=4)
    parser.add_argument("--small-shards", type=int, default=64)
    parser.add_argument("--small-shard-mb", type=float, default=0.25)
    parser.add_argument("--small-passes", type=int, default=40)
    parser.add_argument("--calls", type=int, default=5000)
    parser.add_argument("--window", type=int, default=8, help="shards per ensure_many in agent-window mode")
    parser.add_argument("--only", help="comma-separated scenario names (default: all)")
    ns = parser.parse_args()
    bench = Bench("coord", ns)
    loop = new_event_loop()
    try:
        out = loop.run_until_complete(main(ns))
    finally:
        loop.close()
    bench.table(f"medians of {ns.runs} rounds, {ns.ranks} ranks, load {os.getloadavg()[0]:.1f}",
                ["scenario", "MB/s", "MB per CPU-s"],
                [[k, f"{v:,.1f}", f"{out['median_mb_per_cpu_s'][k]:,.1f}"] for k, v in out["median_mb_s"].items()])
    bench.table("the targets: medians of per-round ratios (busy leader, any spinner: 1 - ratio is the slowdown)",
                ["figure", "value"], [[k, v] for k, v in out["summary"].items()])
