"""A node's first transfers go to every reader's first batch (issue #21, item 4).

Several ranks of one node share one agent; each asks for its first shards and then the
ones after them. However their requests interleave, the node fetches the shard every
rank's first batch reads before any rank's later shards: a rank that joins last does not
wait for the others' look-ahead.

The order checked is the order the agent starts its shard transfers (a spy on the HTTP
backend's ``fetch_into``, called as soon as a transfer holds its download slot), not the
order requests reach the server: two transfers started together race to the server (one
on a pooled connection, one opening a new one), so the server's log can put a later
shard first although the node started it second.
"""

from __future__ import annotations

import asyncio
import json
import threading
from pathlib import Path
from typing import Any

import pytest
from helpers import THREAD_AGENT

from astream import MDSWriter, StreamingDataset
from astream._coord.world import World
from astream._node.provider import shard_key
from astream._sampling.order import worker_batches
from astream._storage.http import HttpStorage
from astream.testing import Fault, LoopbackServer

RANKS = 3
BATCH = 8


def _write(root: Path) -> None:
    with MDSWriter(out=str(root), columns={"id": "int64", "x": "bytes"}, size_limit="17kb") as w:
        for i in range(240):
            w.write({"id": i, "x": bytes([i % 251]) * 1000})


def _shards_in_order(ds: StreamingDataset) -> list[int]:
    """The shards this rank reads, in the order it first reads them."""
    plan = ds.plan(epoch=0, sample_in_epoch=0, workers_per_rank=1, batch_size=BATCH)
    world = ds.config.world
    order = worker_batches(plan, world.node, world.local_rank, 0)
    shards, _ = ds.sample_map.locate(order.ids[: order.num_samples])
    seen: list[int] = []
    for s in shards.tolist():
        if s not in seen:
            seen.append(s)
    return seen


def test_every_ranks_first_shard_is_fetched_before_any_second(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    started: list[str] = []  # whole-shard transfers, in the order the agent started them
    fetch_into = HttpStorage.fetch_into

    async def spy(self: HttpStorage, url: str, *args: Any, **kwargs: Any) -> Any:
        started.append(url.rsplit("/", 1)[-1])
        return await fetch_into(self, url, *args, **kwargs)

    monkeypatch.setattr(HttpStorage, "fetch_into", spy)
    _write(tmp_path / "remote")
    index = json.loads((tmp_path / "remote" / "index.json").read_text())
    names = [s["raw_data"]["basename"] for s in index["shards"]]
    gate = threading.Event()
    with LoopbackServer(str(tmp_path / "remote")) as server:
        # The node's first transfer (rank 0's first shard) waits until every rank has asked
        # for its shards, so the requests stand in the agent in the order the ranks came.
        server.add(Fault("stall", match="shard.*", ranged=False, gate=gate))
        datasets = [
            StreamingDataset(remote=server.url, local=str(tmp_path / "cache"), batch_size=BATCH,
                             num_canonical_nodes=RANKS, run_id="first-shards", coord=THREAD_AGENT,
                             world=World(rank=r, world_size=RANKS, local_rank=r, ranks_per_node=RANKS))
            for r in range(RANKS)
        ]
        orders = [_shards_in_order(ds) for ds in datasets]
        firsts = [o[0] for o in orders]
        seconds = [o[1] for o in orders]
        assert len(set(firsts)) == RANKS  # the case this test needs
        assert not set(firsts) & set(seconds)

        async def read(ds: StreamingDataset) -> list[int]:
            async with ds.open_epoch_reader(0, 0, worker=0, workers_per_rank=1, batch_size=BATCH) as reader:
                return [int(i) async for batch in reader.batches() for i in batch["id"]]

        async def asked(ds: StreamingDataset, keys: set[str]) -> None:
            """Until the agent has ``keys`` in flight, and every fetch in flight waits for its slot."""
            node = await ds.node()
            while True:
                stats = await node.stats()
                if keys <= set(stats["inflight"]) and stats["provider"]["misses"] >= len(stats["inflight"]):
                    return
                await asyncio.sleep(0.005)

        async def main() -> list[list[int]]:
            tasks = []
            try:
                for r, ds in enumerate(datasets):  # one rank after the other, each asking for two shards or more
                    tasks.append(asyncio.create_task(read(ds)))
                    await asyncio.wait_for(asked(ds, {shard_key(0, firsts[r]), shard_key(0, seconds[r])}), 20)
                gate.set()
                return list(await asyncio.wait_for(asyncio.gather(*tasks), 60))
            finally:
                gate.set()
                for ds in datasets:
                    await ds.aclose()

        got = asyncio.run(main())
    fetched = [name for name in started if name.startswith("shard.")]
    for r, ds in enumerate(datasets):
        ds.close()
        assert got[r] == list(range(80 * r, 80 * (r + 1)))  # each rank's contiguous share, exact
    position = {name: fetched.index(name) for name in set(fetched)}
    assert max(position[names[s]] for s in firsts) < min(position[names[s]] for s in seconds), fetched
