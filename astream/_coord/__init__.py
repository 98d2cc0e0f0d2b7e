r"""Per-node coordination over a Unix socket (DESIGN.md, layer 5).

- :class:`World` — where a process sits (node, rank, local rank, worker), from the launcher.
- :class:`AsyncNodeClient` — a rank's or worker's membership of its node: it finds (or
  elects and starts) the node agent, then ``ensure``/``ensure_many``/``pin``/``unpin``
  shards, meets at barriers (``barrier``) and agrees on the epoch (``begin_epoch``).
- :class:`ShardProvider` — the seam to the node's shard cache, built in the agent's
  process by a picklable :data:`ProviderFactory` (the package's is the shard engine's
  ``astream._node.provider.CacheProvider``).
- :class:`CoordConfig` — every timeout and limit of the above.

How a dataset process (a rank, or one of its loader workers) joins its node::

    world = World.from_env(worker=worker_id, workers_per_rank=num_workers)
    async with AsyncNodeClient(local_root, provider_factory, world=world) as node:
        epoch = await node.begin_epoch()            # every worker of the node, same answer
        paths = await node.ensure_many(next_shards, pin=True)   # one round trip per window
        ...                                         # read samples from the pinned files
        for key in next_shards:
            await node.unpin(key)
        await node.barrier("end-of-epoch")          # names the missing/dead if it fails

One agent serves one ``local_root`` per run; a dataset with several streams uses one root
(and keys like ``"s1/shard.00003.mds"`` that its provider maps to each stream's folder).
"""

from astream._coord.client import AsyncNodeClient
from astream._coord.config import CoordConfig
from astream._coord.link import AgentLost
from astream._coord.provider import (
    ProviderFactory,
    ShardProvider,
    StageCallback,
)
from astream._coord.rendezvous import default_run_id
from astream._coord.watchdog import WatchdogTimeout
from astream._coord.wire import PROTOCOL_VERSION, ProtocolError, VersionMismatch
from astream._coord.world import World

__all__ = [
    "PROTOCOL_VERSION",
    "AgentLost",
    "AsyncNodeClient",
    "CoordConfig",
    "ProtocolError",
    "ProviderFactory",
    "ShardProvider",
    "StageCallback",
    "VersionMismatch",
    "WatchdogTimeout",
    "World",
    "default_run_id",
]
