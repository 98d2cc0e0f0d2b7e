"""Where this process sits in the training world: node, rank, local rank and worker.

:class:`World` is a pure, frozen value. :func:`detect_world` (and :meth:`World.from_env`)
reads it from the launcher's environment; the first of these that applies wins:

1. an explicit ``world=`` given to the dataset (never overridden by the environment);
2. torchrun / torch.distributed: ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``LOCAL_WORLD_SIZE``;
3. JAX multi-process: ``jax.process_index()`` / ``jax.process_count()``, consulted only
   when the program has already imported JAX and called ``jax.distributed.initialize``
   (astream never imports JAX itself); one process per host unless ``LOCAL_WORLD_SIZE``
   says otherwise;
4. SLURM: ``SLURM_PROCID``, ``SLURM_NTASKS``, ``SLURM_LOCALID`` and
   ``SLURM_NTASKS_PER_NODE`` or ``SLURM_TASKS_PER_NODE`` (``"4(x2)"`` forms);
5. Open MPI (``mpirun``): ``OMPI_COMM_WORLD_RANK``, ``OMPI_COMM_WORLD_SIZE``,
   ``OMPI_COMM_WORLD_LOCAL_RANK``, ``OMPI_COMM_WORLD_LOCAL_SIZE``;
6. PMI (MPICH, Intel MPI, Cray): ``PMI_RANK``, ``PMI_SIZE``, with the local rank and size
   from ``MPI_LOCALRANKID`` / ``MPI_LOCALNRANKS`` or ``PMI_LOCAL_RANK`` / ``PMI_LOCAL_SIZE``;
7. ``TF_CONFIG`` (TensorFlow's multi-worker JSON): the ``task``'s place among the
   cluster's ``chief`` then ``worker`` tasks, one task per node unless ``LOCAL_WORLD_SIZE``
   says otherwise;
8. none of them: a single process, world size 1.

Where a launcher gives no ranks-per-node figure, every rank is its own node (MosaicML's
default for a missing ``LOCAL_WORLD_SIZE``). Like MosaicML Streaming (spec 4.1), every node
holds the same number of ranks: ``node = rank // ranks_per_node`` and
``num_nodes = world_size // ranks_per_node``.
"""

from __future__ import annotations

import json
import os
import re
import sys
from collections.abc import Callable, Mapping
from dataclasses import dataclass, replace

from astream.errors import ConfigError

__all__ = ["LAUNCHERS", "LAUNCHER_VARIABLES", "World", "detect_world", "member_name", "parse_slurm_tasks_per_node"]

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
        return detect_world(env, worker=worker, workers_per_rank=workers_per_rank)[0]


def detect_world(
    env: Mapping[str, str] | None = None, *, worker: int = 0, workers_per_rank: int = 1
) -> tuple[World, str]:
    """The world from the first launcher whose variables are present, and that launcher's name.

    The order is the module docstring's; ``"single process"`` when no launcher applies.

    Raises:
        ConfigError: a launcher's variables are missing, not integers, or contradict each
            other; the message names them.
    """
    env = os.environ if env is None else env
    for name, read in LAUNCHERS:
        world = read(env, worker, workers_per_rank)
        if world is not None:
            return world, name
    return World(worker=worker, workers_per_rank=workers_per_rank), "single process"


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


def _from_vars(
    env: Mapping[str, str], worker: int, workers: int, rank_var: str, size_var: str,
    local_pairs: tuple[tuple[str, str], ...],
) -> World | None:
    """A world from a launcher's rank and size variables, and the first (local rank, local size) pair present."""
    if rank_var not in env and size_var not in env:
        return None
    missing = [n for n in (rank_var, size_var) if n not in env]
    if missing:
        raise ConfigError(f"{rank_var} and {size_var} must be set together; {', '.join(missing)} is missing")
    rank, size = _int(env, rank_var), _int(env, size_var)
    local_rank_var, local_size_var = next(
        (pair for pair in local_pairs if pair[0] in env or pair[1] in env), local_pairs[0]
    )
    # No local size: every rank its own node, as MosaicML defaults a missing LOCAL_WORLD_SIZE.
    per_node = _int(env, local_size_var, 1)
    local = _int(env, local_rank_var, rank % per_node if per_node > 0 else 0)
    return _build(
        f"{rank_var}/{size_var}/{local_rank_var}/{local_size_var}",
        rank=rank, world_size=size, local_rank=local, ranks_per_node=per_node, worker=worker, workers_per_rank=workers,
    )


def _from_torchrun(env: Mapping[str, str], worker: int, workers: int) -> World | None:
    return _from_vars(env, worker, workers, "RANK", "WORLD_SIZE", (("LOCAL_RANK", "LOCAL_WORLD_SIZE"),))


def _from_openmpi(env: Mapping[str, str], worker: int, workers: int) -> World | None:
    return _from_vars(env, worker, workers, "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
                      (("OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE"),))


def _from_pmi(env: Mapping[str, str], worker: int, workers: int) -> World | None:
    # Hydra (MPICH, Intel MPI) exports MPI_LOCAL*; Cray's and other PMIs PMI_LOCAL_*.
    return _from_vars(env, worker, workers, "PMI_RANK", "PMI_SIZE",
                      (("MPI_LOCALRANKID", "MPI_LOCALNRANKS"), ("PMI_LOCAL_RANK", "PMI_LOCAL_SIZE")))


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


def _from_slurm(env: Mapping[str, str], worker: int, workers: int) -> World | None:
    if "SLURM_PROCID" not in env or "SLURM_NTASKS" not in env:
        return None
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


def _from_tf_config(env: Mapping[str, str], worker: int, workers: int) -> World | None:
    raw = env.get("TF_CONFIG")
    if not raw:
        return None

    def bad(what: str) -> ConfigError:
        return ConfigError(f"TF_CONFIG {what}; it must be JSON like "
                           '{"cluster": {"worker": ["host:port", ...]}, "task": {"type": "worker", "index": 0}}')

    try:
        config = json.loads(raw)
    except ValueError:
        raise bad("is not valid JSON") from None
    cluster = config.get("cluster") if isinstance(config, dict) else None
    task = config.get("task") if isinstance(config, dict) else None
    if not isinstance(cluster, dict) or not isinstance(task, dict):
        raise bad("needs a 'cluster' object and a 'task' object")
    kind, index = task.get("type"), task.get("index", 0)
    chiefs, tasks = cluster.get("chief") or [], cluster.get("worker") or []
    if not isinstance(chiefs, list) or not isinstance(tasks, list) or isinstance(index, bool) or not isinstance(index, int):
        raise bad("has a malformed 'chief', 'worker' or task 'index'")
    if kind not in ("chief", "worker"):
        raise ConfigError(
            f"TF_CONFIG task type {kind!r} does not read training data: astream's ranks are the 'chief' and "
            "'worker' tasks; pass world= to a dataset used elsewhere"
        )
    # The chief trains too (MultiWorkerMirroredStrategy): it comes first, then the workers.
    rank = index if kind == "chief" else len(chiefs) + index
    per_node = _int(env, "LOCAL_WORLD_SIZE", 1)
    return _build(
        "TF_CONFIG/LOCAL_WORLD_SIZE",
        rank=rank, world_size=len(chiefs) + len(tasks), local_rank=rank % per_node, ranks_per_node=per_node,
        worker=worker, workers_per_rank=workers,
    )


Reader = Callable[[Mapping[str, str], int, int], World | None]

#: The launchers in the order they are tried (the module docstring's), by name.
LAUNCHERS: tuple[tuple[str, Reader], ...] = (
    ("torchrun", _from_torchrun),
    ("jax.distributed", _from_jax),
    ("SLURM", _from_slurm),
    ("Open MPI", _from_openmpi),
    ("PMI", _from_pmi),
    ("TF_CONFIG", _from_tf_config),
)

#: Every environment variable the launchers above are read from (to clear them in tests).
LAUNCHER_VARIABLES: tuple[str, ...] = (
    "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID",
    "SLURM_NTASKS_PER_NODE", "SLURM_TASKS_PER_NODE", "SLURM_JOB_NUM_NODES", "SLURM_NNODES", "OMPI_COMM_WORLD_RANK",
    "OMPI_COMM_WORLD_SIZE", "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE", "PMI_RANK", "PMI_SIZE",
    "MPI_LOCALRANKID", "MPI_LOCALNRANKS", "PMI_LOCAL_RANK", "PMI_LOCAL_SIZE", "TF_CONFIG",
)
