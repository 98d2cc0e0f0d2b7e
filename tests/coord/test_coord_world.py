"""World from launcher environments (torchrun, SLURM, JAX) and its derived numbers."""

from __future__ import annotations

import sys
import types

import pytest

from astream._coord.world import World, parse_slurm_tasks_per_node
from astream.errors import ConfigError


def test_single_process_defaults() -> None:
    world = World.from_env({})
    assert (world.rank, world.world_size, world.node, world.num_nodes, world.global_worker) == (0, 1, 0, 1, 0)
    assert world.is_local_leader
    assert world.member == "rank0.worker0"


def test_torchrun() -> None:
    env = {"RANK": "11", "WORLD_SIZE": "16", "LOCAL_RANK": "3", "LOCAL_WORLD_SIZE": "8"}
    world = World.from_env(env, worker=1, workers_per_rank=2)
    assert (world.node, world.num_nodes, world.local_rank) == (1, 2, 3)
    assert world.global_worker == 23
    assert world.worker_of_node == 7
    assert world.workers_per_node == 16
    assert world.num_workers == 32
    assert not world.is_local_leader
    assert world.node_members()[:3] == ("rank8.worker0", "rank8.worker1", "rank9.worker0")
    assert len(world.node_members()) == 16
    assert world.node_members(workers=False) == tuple(f"rank{r}.worker0" for r in range(8, 16))


def test_torchrun_without_local_world_size_follows_mosaicml() -> None:
    world = World.from_env({"RANK": "2", "WORLD_SIZE": "4"})
    assert (world.ranks_per_node, world.node, world.num_nodes) == (1, 2, 4)


@pytest.mark.parametrize(
    ("env", "names"),
    [
        ({"RANK": "4", "WORLD_SIZE": "4"}, "RANK"),
        ({"RANK": "1", "WORLD_SIZE": "6", "LOCAL_WORLD_SIZE": "4"}, "LOCAL_WORLD_SIZE"),
        ({"RANK": "5", "WORLD_SIZE": "8", "LOCAL_RANK": "2", "LOCAL_WORLD_SIZE": "4"}, "LOCAL_RANK"),
        ({"RANK": "x", "WORLD_SIZE": "8"}, "RANK"),
        ({"WORLD_SIZE": "8"}, "RANK"),
    ],
)
def test_torchrun_inconsistent(env: dict[str, str], names: str) -> None:
    with pytest.raises(ConfigError, match=names):
        World.from_env(env)


def test_slurm() -> None:
    env = {"SLURM_PROCID": "5", "SLURM_NTASKS": "8", "SLURM_LOCALID": "1", "SLURM_TASKS_PER_NODE": "4(x2)"}
    world = World.from_env(env)
    assert (world.node, world.num_nodes, world.local_rank, world.ranks_per_node) == (1, 2, 1, 4)


def test_torchrun_wins_over_slurm() -> None:
    env = {"RANK": "0", "WORLD_SIZE": "1", "SLURM_PROCID": "5", "SLURM_NTASKS": "8"}
    assert World.from_env(env).world_size == 1


def test_slurm_uneven_nodes_refused() -> None:
    env = {"SLURM_PROCID": "0", "SLURM_NTASKS": "7", "SLURM_NTASKS_PER_NODE": "4,3"}
    with pytest.raises(ConfigError, match="differ between nodes"):
        World.from_env(env)


def test_slurm_inconsistent_names_variables() -> None:
    env = {"SLURM_PROCID": "2", "SLURM_NTASKS": "4", "SLURM_LOCALID": "1", "SLURM_NTASKS_PER_NODE": "2"}
    with pytest.raises(ConfigError, match="SLURM_PROCID/SLURM_NTASKS/SLURM_LOCALID"):
        World.from_env(env)


def test_parse_slurm_tasks_per_node() -> None:
    assert parse_slurm_tasks_per_node("4(x2),3") == [4, 4, 3]
    assert parse_slurm_tasks_per_node("8") == [8]
    with pytest.raises(ConfigError):
        parse_slurm_tasks_per_node("4(2)")


def test_jax_only_when_imported_and_initialised(monkeypatch: pytest.MonkeyPatch) -> None:
    assert World.from_env({}).world_size == 1  # jax not imported: never imported by astream
    fake = types.SimpleNamespace(
        distributed=types.SimpleNamespace(is_initialized=lambda: False),
        process_index=lambda: 3, process_count=lambda: 4,
    )
    monkeypatch.setitem(sys.modules, "jax", fake)
    assert World.from_env({}).world_size == 1
    fake.distributed.is_initialized = lambda: True
    world = World.from_env({})
    assert (world.rank, world.world_size, world.node, world.num_nodes) == (3, 4, 3, 4)


def test_direct_construction_validates() -> None:
    with pytest.raises(ConfigError, match="worker"):
        World(worker=2, workers_per_rank=2)
    with pytest.raises(ConfigError, match="int"):
        World(rank=True)
    assert World(rank=3, world_size=4, local_rank=1, ranks_per_node=2).with_worker(1, 3).global_worker == 10
