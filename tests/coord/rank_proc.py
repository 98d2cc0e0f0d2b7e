"""One rank/worker of a simulated node, run as a subprocess by the coordination tests.

Usage: ``python rank_proc.py '<json spec>'`` (see conftest.start_rank). Prints one JSON
object per line: joined, epoch, sample (per shard read and checked), pinned, done, error.
"""

from __future__ import annotations

import asyncio
import hashlib
import json
import os
import sys
from pathlib import Path
from typing import Any

from astream._coord.client import AsyncNodeClient
from astream._coord.config import CoordConfig
from astream._coord.world import World

sys.path.insert(0, str(Path(__file__).resolve().parents[2]))  # the factory is pickled as tests.coord...
from astream.errors import AstreamError
from tests.coord.simple_provider import SimpleProviderFactory


def emit(event: str, **fields: Any) -> None:
    sys.stdout.write(json.dumps({"event": event, **fields}) + "\n")
    sys.stdout.flush()


async def main(spec: dict[str, Any]) -> int:
    world = World(rank=spec["rank"], world_size=spec["world_size"], local_rank=spec["rank"] % spec["ranks_per_node"],
                  ranks_per_node=spec["ranks_per_node"], worker=spec["worker"],
                  workers_per_rank=spec["workers_per_rank"])
    config = CoordConfig(**spec["config"])
    factory = SimpleProviderFactory(spec["remote"], spec["local"])
    try:
        async with AsyncNodeClient(spec["local"], factory, run_id=spec["run_id"], world=world,
                                   member=spec["member"], config=config) as node:
            emit("joined", pid=os.getpid(), agent_pid=node.agent_pid, leader=node.started_agents > 0)
            if spec.get("begin_epoch", True):
                emit("epoch", epoch=await node.begin_epoch(spec.get("parties")))
            if spec.get("hold_pins"):
                for key in spec["keys"]:
                    await node.ensure(key, pin=True)
                emit("pinned", keys=spec["keys"])
                await asyncio.sleep(3600)
            for key in spec["keys"]:
                async with node.pinned(key) as path:
                    data = await asyncio.to_thread(Path(path).read_bytes)
                    ok = hashlib.sha256(data).hexdigest() == spec["digests"][key]
                emit("sample", key=key, ok=ok, agent_pid=node.agent_pid)
                if spec.get("per_shard_sleep"):
                    await asyncio.sleep(spec["per_shard_sleep"])
            if spec.get("end_barrier"):
                await node.barrier("end", spec.get("parties"))
            emit("done", started_agents=node.started_agents)
    except AstreamError as exc:
        emit("error", type=type(exc).__name__, message=str(exc))
        return 3
    return 0


if __name__ == "__main__":
    sys.exit(asyncio.run(main(json.loads(sys.argv[1]))))
