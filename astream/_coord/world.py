"""Where this process sits in the training world: node, rank, local rank and worker.

:class:`World` is a pure, frozen value. :meth:`World.from_env` reads it from the
launcher's environment, in this order of preference:

1. torchrun / torch.distributed names: ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``,
   ``LOCAL_WORLD_SIZE``;
2. SLURM: ``SLURM_PROCID``, ``SLURM_NTASKS``, ``SLURM_LOCALID`` and
   ``SLURM_NTASKS_PER_NODE`` or ``SLURM_TASKS_PER_NODE`` (``"4(x2)"`` forms);
3. JAX multi-process: ``jax.process_index()`` / ``jax.process_count()``, consulted only
   when the program has already imported JAX and called ``jax.distributed.initialize``
   (astream never imports JAX itself); one process per host;
4. none of them: a single process, world size 1.

Like MosaicML Streaming (spec 4.1), every node is assumed to hold the same number of
ranks: ``node = rank // ranks_per_node`` and ``num_nodes = world_size // ranks_per_node``.
"""

from __future__ import annotations

import re
import sys
from collections.abc import Mapping
from dataclasses import dataclass, replace

from astream.errors import ConfigError

__all__ = ["World", "member_name", "parse_slurm_tasks_per_node"]

_SLURM_GROUP = re.compile(r"^\s*(\d+)\s*(?:\(x(\d+)\))?\s*$")


@dataclass(frozen=True)
class World:
    """The place of one process (and one of its workers) in the world.

    Attributes:
        rank: global rank, ``0 <= rank < world_size``.
        world_size: number of ranks in the job.
        local_rank: rank within its node.
        ranks_per_node: ranks on every node (the same on all nodes).
        worker: this loader worker's index within its rank (0 in the rank's own process).
        workers_per_rank: loader workers per rank (1 when there are none).
    """

    rank: int = 0
    world_size: int = 1
    local_rank: int = 0
    ranks_per_node: int = 1
    worker: int = 0
    workers_per_rank: int = 1

    def __post_init__(self) -> None:
        for name in ("rank", "world_size", "local_rank", "ranks_per_node", "worker", "workers_per_rank"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int):
                raise ConfigError(f"World.{name} must be an int, got {value!r}")
        if self.world_size < 1 or self.ranks_per_node < 1 or self.workers_per_rank < 1:
            raise ConfigError(
                f"world_size ({self.world_size}), ranks_per_node ({self.ranks_per_node}) and "
                f"workers_per_rank ({self.workers_per_rank}) must all be >= 1"
            )
        if not 0 <= self.rank < self.world_size:
            raise ConfigError(f"rank {self.rank} is outside 0..{self.world_size - 1} (world_size)")
        if self.world_size % self.ranks_per_node:
            raise ConfigError(
                f"world_size {self.world_size} is not a multiple of ranks_per_node {self.ranks_per_node}: "
                "astream needs the same number of ranks on every node"
            )
        if not 0 <= self.local_rank < self.ranks_per_node:
            raise ConfigError(f"local_rank {self.local_rank} is outside 0..{self.ranks_per_node - 1}")
        if self.rank % self.ranks_per_node != self.local_rank:
            raise ConfigError(
                f"rank {self.rank} with {self.ranks_per_node} ranks per node should have local rank "
                f"{self.rank % self.ranks_per_node}, not {self.local_rank}: ranks must be laid out node by node"
            )
        if not 0 <= self.worker < self.workers_per_rank:
            raise ConfigError(f"worker {self.worker} is outside 0..{self.workers_per_rank - 1}")

    # -- derived --------------------------------------------------------------------

    @property
    def node(self) -> int:
        """This rank's node index."""
        return self.rank // self.ranks_per_node

    @property
    def num_nodes(self) -> int:
        """Number of nodes."""
        return self.world_size // self.ranks_per_node

    @property
    def workers_per_node(self) -> int:
        """Loader workers on one node, over all its ranks."""
        return self.ranks_per_node * self.workers_per_rank

    @property
    def num_workers(self) -> int:
        """Loader workers in the whole world."""
        return self.world_size * self.workers_per_rank

    @property
    def global_worker(self) -> int:
        """Global worker index, ``rank * workers_per_rank + worker`` (MosaicML's order)."""
        return self.rank * self.workers_per_rank + self.worker

    @property
    def worker_of_node(self) -> int:
        """This worker's index among the workers of its node."""
        return self.local_rank * self.workers_per_rank + self.worker

    @property
    def is_local_leader(self) -> bool:
        """True for worker 0 of local rank 0 (MosaicML's "local leader")."""
        return self.worker_of_node == 0

    @property
    def member(self) -> str:
        """Name of this process in node-wide messages, e.g. ``"rank3.worker1"``."""
        return member_name(self.rank, self.worker)

    def node_members(self, *, workers: bool = True) -> tuple[str, ...]:
        """Member names of every process of this node (every worker, or every rank's worker 0)."""
        first = self.node * self.ranks_per_node
        per_rank = range(self.workers_per_rank) if workers else range(1)
        return tuple(member_name(r, w) for r in range(first, first + self.ranks_per_node) for w in per_rank)

    def with_worker(self, worker: int, workers_per_rank: int) -> World:
        """This rank's world as seen by one of its loader workers."""
        return replace(self, worker=worker, workers_per_rank=workers_per_rank)

    # -- construction ----------------------------------------------------------------

    @classmethod
    def from_env(cls, env: Mapping[str, str] | None = None, *, worker: int = 0, workers_per_rank: int = 1) -> World:
        """Read the world from launcher environment variables (see the module docstring).

        Args:
            env: the environment to read; ``os.environ`` when None.
            worker: this process's loader-worker index within its rank.
            workers_per_rank: loader workers per rank.

        Raises:
            ConfigError: variables are missing, not integers, or contradict each other;
                the message names them.
        """
        import os

        env = os.environ if env is None else env
        if "RANK" in env or "WORLD_SIZE" in env:
            return _from_torchrun(env, worker, workers_per_rank)
        if "SLURM_PROCID" in env and "SLURM_NTASKS" in env:
            return _from_slurm(env, worker, workers_per_rank)
        jax_world = _from_jax(env, worker, workers_per_rank)
        if jax_world is not None:
            return jax_world
        return cls(worker=worker, workers_per_rank=workers_per_rank)


def member_name(rank: int, worker: int) -> str:
    """The node-wide name of a (rank, worker) process."""
    return f"rank{rank}.worker{worker}"


def _int(env: Mapping[str, str], name: str, default: int | None = None) -> int:
    raw = env.get(name)
    if raw is None or raw.strip() == "":
        if default is None:
            raise ConfigError(f"environment variable {name} is not set")
        return default
    try:
        return int(raw)
    except ValueError:
        raise ConfigError(f"environment variable {name}={raw!r} is not an integer") from None


def _build(names: str, **fields: int) -> World:
    try:
        return World(**fields)
    except ConfigError as exc:
        raise ConfigError(f"inconsistent {names}: {exc}") from None


def _from_torchrun(env: Mapping[str, str], worker: int, workers: int) -> World:
    missing = [n for n in ("RANK", "WORLD_SIZE") if n not in env]
    if missing:
        raise ConfigError(f"RANK and WORLD_SIZE must be set together; {', '.join(missing)} is missing")
    rank, size = _int(env, "RANK"), _int(env, "WORLD_SIZE")
    # MosaicML defaults LOCAL_WORLD_SIZE to 1 (every rank its own node); so do we.
    per_node = _int(env, "LOCAL_WORLD_SIZE", 1)
    local = _int(env, "LOCAL_RANK", rank % per_node if per_node > 0 else 0)
    return _build(
        "RANK/WORLD_SIZE/LOCAL_RANK/LOCAL_WORLD_SIZE",
        rank=rank, world_size=size, local_rank=local, ranks_per_node=per_node,
        worker=worker, workers_per_rank=workers,
    )


def parse_slurm_tasks_per_node(value: str) -> list[int]:
    """Expand SLURM's compressed task counts, ``"4(x2),3"`` → ``[4, 4, 3]``.

    Raises:
        ConfigError: the value is not in SLURM's format.
    """
    counts: list[int] = []
    for group in value.split(","):
        match = _SLURM_GROUP.match(group)
        if not match:
            raise ConfigError(f"SLURM tasks-per-node value {value!r} is not like '4' or '4(x2),3'")
        counts.extend([int(match.group(1))] * int(match.group(2) or 1))
    return counts


def _from_slurm(env: Mapping[str, str], worker: int, workers: int) -> World:
    rank, size = _int(env, "SLURM_PROCID"), _int(env, "SLURM_NTASKS")
    raw = env.get("SLURM_NTASKS_PER_NODE") or env.get("SLURM_TASKS_PER_NODE")
    if raw is None:
        per_node = size // _int(env, "SLURM_JOB_NUM_NODES", _int(env, "SLURM_NNODES", 1))
    else:
        counts = parse_slurm_tasks_per_node(raw)
        if len(set(counts)) != 1:
            raise ConfigError(
                f"SLURM tasks per node {raw!r} differ between nodes; astream needs the same number of ranks on every node"
            )
        per_node = counts[0]
    local = _int(env, "SLURM_LOCALID", rank % per_node if per_node else 0)
    return _build(
        "SLURM_PROCID/SLURM_NTASKS/SLURM_LOCALID/SLURM_NTASKS_PER_NODE",
        rank=rank, world_size=size, local_rank=local, ranks_per_node=per_node,
        worker=worker, workers_per_rank=workers,
    )


def _from_jax(env: Mapping[str, str], worker: int, workers: int) -> World | None:
    jax = sys.modules.get("jax")
    if jax is None:
        return None
    distributed = getattr(jax, "distributed", None)
    is_initialized = getattr(distributed, "is_initialized", None)
    if not callable(is_initialized) or not is_initialized():
        return None
    rank, size = int(jax.process_index()), int(jax.process_count())
    per_node = _int(env, "LOCAL_WORLD_SIZE", 1)
    return _build(
        "jax.process_index()/jax.process_count()/LOCAL_WORLD_SIZE",
        rank=rank, world_size=size, local_rank=rank % per_node, ranks_per_node=per_node,
        worker=worker, workers_per_rank=workers,
    )
