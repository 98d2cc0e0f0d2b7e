"""Per-node coordination over a Unix socket (DESIGN.md, layer 5).

- :class:`World` — where a process sits (node, rank, local rank, worker), from the launcher.
- :class:`AsyncNodeClient` — a rank's or worker's membership of its node: it finds (or
  elects and starts) the node agent, then ``ensure``/``pin``/``unpin`` shards, meets at
  ``barrier``\\ s and agrees on the epoch (``begin_epoch``).
- :class:`ShardProvider` — the seam to the node's shard cache, built in the agent's
  process by a picklable :data:`ProviderFactory`; :class:`SimpleProvider` is a small one.
- :class:`CoordConfig` — every timeout and limit of the above.
"""

from astream._coord.client import AsyncNodeClient
from astream._coord.config import CoordConfig
from astream._coord.link import AgentLost
from astream._coord.provider import (
    ProviderFactory,
    ShardProvider,
    SimpleProvider,
    SimpleProviderFactory,
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
    "SimpleProvider",
    "SimpleProviderFactory",
    "StageCallback",
    "VersionMismatch",
    "WatchdogTimeout",
    "World",
    "default_run_id",
]
