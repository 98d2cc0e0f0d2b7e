"""Real processes on one machine: ranks and workers of simulated nodes, SIGKILLs, cleanliness."""

from __future__ import annotations

import asyncio
import os
import signal
from pathlib import Path
from typing import Any

import pytest
from coordkit import assert_clean, config_dict, counts, make_shards, shm_paths, slow_down

from astream._coord.client import AsyncNodeClient
from astream._coord.config import CoordConfig
from astream._coord.world import World, member_name
from astream.errors import CoordinationError
from astream.testing import LoopbackServer
from tests.coord.simple_provider import SimpleProviderFactory

pytestmark = pytest.mark.slow


def node_specs(*, node: int, nodes: int, ranks: int, workers: int, local: Path, remote: str, run_id: str,
               digests: dict[str, str], keys: Any, config: CoordConfig, **extra: Any) -> list[dict[str, Any]]:
    """Specs of every rank × worker process of one node; ``keys(global_worker, n_workers)`` picks shards."""
    specs = []
    for local_rank in range(ranks):
        rank = node * ranks + local_rank
        for worker in range(workers):
            gw = rank * workers + worker
            specs.append({
                "local": str(local), "remote": remote, "run_id": run_id, "member": member_name(rank, worker),
                "rank": rank, "world_size": nodes * ranks, "ranks_per_node": ranks, "worker": worker,
                "workers_per_rank": workers, "keys": keys(gw, nodes * ranks * workers), "digests": digests,
                "config": config_dict(config), **extra,
            })
    return specs


def rotated(all_keys: list[str]) -> Any:
    return lambda gw, n: all_keys[gw % len(all_keys):] + all_keys[: gw % len(all_keys)]


def partitioned(all_keys: list[str]) -> Any:
    return lambda gw, n: all_keys[gw::n]


async def test_eight_ranks_two_workers_fetch_each_shard_once(
    tmp_path: Path, http_server: LoopbackServer, ranks: Any, run_id: str, config: CoordConfig
) -> None:
    digests = make_shards(Path(http_server.root), 12)
    keys = sorted(digests)
    slow_down(http_server, 0.02)  # overlapping requests for the same shard
    local = tmp_path / "cache"
    specs = node_specs(node=0, nodes=1, ranks=8, workers=2, local=local, remote=http_server.url, run_id=run_id,
                       digests=digests, keys=rotated(keys), config=config, end_barrier=True)
    procs = [await ranks(spec) for spec in specs]
    codes = await asyncio.gather(*(p.finish(90) for p in procs))
    assert codes == [0] * 16, [p.lines[-1:] for p in procs]
    assert counts(http_server, keys) == dict.fromkeys(keys, 1), "each shard must be fetched once per node"
    for p in procs:
        samples = p.events("sample")
        assert [s["key"] for s in samples] == p.spec["keys"]
        assert all(s["ok"] for s in samples)
    assert sum(p.events("done")[0]["started_agents"] for p in procs) == 1, "exactly one leader"
    assert_clean(local, run_id, config)


async def test_several_nodes_share_one_server(
    tmp_path: Path, http_server: LoopbackServer, ranks: Any, run_id: str, config: CoordConfig
) -> None:
    digests = make_shards(Path(http_server.root), 6)
    keys = sorted(digests)
    procs = [
        await ranks(spec)
        for node in range(3)
        for spec in node_specs(node=node, nodes=3, ranks=2, workers=1, local=tmp_path / f"node{node}",
                               remote=http_server.url, run_id=run_id, digests=digests, keys=rotated(keys),
                               config=config, end_barrier=True)
    ]
    assert await asyncio.gather(*(p.finish(60) for p in procs)) == [0] * 6
    assert counts(http_server, keys) == dict.fromkeys(keys, 3), "once per node, three nodes"
    agents = {p.events("joined")[0]["agent_pid"] for p in procs}
    assert len(agents) == 3, "one agent per node"
    for node in range(3):
        assert_clean(tmp_path / f"node{node}", run_id, config)


async def test_leader_killed_mid_epoch(
    tmp_path: Path, http_server: LoopbackServer, ranks: Any, run_id: str, config: CoordConfig
) -> None:
    digests = make_shards(Path(http_server.root), 16)
    keys = sorted(digests)
    slow_down(http_server, 0.03)
    local = tmp_path / "cache"
    specs = node_specs(node=0, nodes=1, ranks=4, workers=1, local=local, remote=http_server.url, run_id=run_id,
                       digests=digests, keys=partitioned(keys), config=config, end_barrier=True,
                       per_shard_sleep=0.15)
    procs = [await ranks(spec) for spec in specs]
    joined = [await p.wait_for("joined") for p in procs]
    leader = next(p for p, j in zip(procs, joined, strict=True) if j["leader"])
    await leader.wait_for("sample")
    leader.kill()
    others = [p for p in procs if p is not leader]
    codes = await asyncio.gather(*(p.finish(60) for p in others))
    for p, code in zip(others, codes, strict=True):
        assert [s["key"] for s in p.events("sample")] == p.spec["keys"], "every sample exactly once"
        assert all(s["ok"] for s in p.events("sample"))
        # the end barrier cannot complete: it must say who died, not hang
        assert code == 3
        error = p.events("error")[0]
        assert error["type"] == "CoordinationError"
        assert leader.spec["member"] in error["message"]
        assert "died" in error["message"]
    await leader.finish(10)
    assert_clean(local, run_id, config)


async def test_agent_killed_others_reelect_and_finish(
    tmp_path: Path, http_server: LoopbackServer, ranks: Any, run_id: str, config: CoordConfig
) -> None:
    digests = make_shards(Path(http_server.root), 16, size=64 * 1024)
    keys = sorted(digests)
    slow_down(http_server, 0.03)
    local = tmp_path / "cache"
    specs = node_specs(node=0, nodes=1, ranks=4, workers=1, local=local, remote=http_server.url, run_id=run_id,
                       digests=digests, keys=partitioned(keys), config=config, end_barrier=True,
                       per_shard_sleep=0.1)
    procs = [await ranks(spec) for spec in specs]
    first_agent = (await procs[0].wait_for("joined"))["agent_pid"]
    await procs[0].wait_for("sample")
    os.kill(first_agent, signal.SIGKILL)
    codes = await asyncio.gather(*(p.finish(60) for p in procs))
    assert codes == [0] * 4, [p.lines[-1:] for p in procs]
    for p in procs:
        assert [s["key"] for s in p.events("sample")] == p.spec["keys"]
        assert all(s["ok"] for s in p.events("sample")), "no corrupt shard after the agent died"
    assert sum(p.events("done")[0]["started_agents"] for p in procs) == 2, "one re-election"
    later_agents = {s["agent_pid"] for p in procs for s in p.events("sample")} - {first_agent}
    assert len(later_agents) == 1
    # the new agent adopted the cache on disk: at most the shards in flight are fetched twice
    assert all(n >= 1 for n in counts(http_server, keys).values())
    assert http_server.count() <= len(keys) + 4
    assert_clean(local, run_id, config)


async def test_killed_worker_releases_pins_and_fails_barrier(
    tmp_path: Path, remote: tuple[Path, dict[str, str]], ranks: Any, run_id: str, config: CoordConfig
) -> None:
    folder, digests = remote
    keys = sorted(digests)[:3]
    local = tmp_path / "cache"
    world = World(rank=0, world_size=2, local_rank=0, ranks_per_node=2)
    [spec] = node_specs(node=0, nodes=1, ranks=1, workers=1, local=local, remote=str(folder), run_id=run_id,
                        digests=digests, keys=lambda gw, n: keys, config=config, hold_pins=True,
                        begin_epoch=False)
    spec["member"] = "holder"
    holder = await ranks(spec)
    factory = SimpleProviderFactory(str(folder), str(local))
    async with AsyncNodeClient(str(local), factory, run_id=run_id, world=world, member="observer",
                               config=config) as node:
        await holder.wait_for("pinned")
        stats = await node.stats()
        assert stats["pins"] == 3
        assert stats["provider"]["pinned"] == 3
        barrier = asyncio.ensure_future(node.barrier("sync", ["observer", "holder"], timeout=20))
        await asyncio.sleep(0.2)
        holder.kill()
        with pytest.raises(CoordinationError, match="holder died"):
            await barrier
        for _ in range(100):
            if (await node.stats())["pins"] == 0:
                break
            await asyncio.sleep(0.05)
        stats = await node.stats()
        assert stats["pins"] == 0
        assert stats["provider"]["pinned"] == 0
    await holder.finish(10)
    assert_clean(local, run_id, config)


async def test_everything_killed_leaves_nothing(
    tmp_path: Path, remote: tuple[Path, dict[str, str]], ranks: Any, run_id: str, config: CoordConfig
) -> None:
    folder, digests = remote
    local = tmp_path / "cache"
    specs = node_specs(node=0, nodes=1, ranks=3, workers=1, local=local, remote=str(folder), run_id=run_id,
                       digests=digests, keys=lambda gw, n: sorted(digests), config=config, hold_pins=True)
    procs = [await ranks(spec) for spec in specs]
    agent = (await procs[0].wait_for("joined"))["agent_pid"]
    for p in procs:
        await p.wait_for("pinned")
    assert not shm_paths([agent, *(p.proc.pid for p in procs)]), "astream uses no /dev/shm"
    os.kill(agent, signal.SIGKILL)
    for p in procs:
        p.kill()
    for p in procs:
        await p.finish(10)
    assert_clean(local, run_id, config, wait=2.0)
