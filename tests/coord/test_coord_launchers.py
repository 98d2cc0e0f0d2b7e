"""World detection from each launcher's environment, in the documented order, and the run id.

Each test sets the launcher's variables in the real environment (monkeypatch) after
removing every variable any launcher sets, then asks :func:`detect_world` with no
arguments, as a dataset does.
"""

from __future__ import annotations

import json
import sys
import types

import pytest

from astream._coord.rendezvous import RUN_ID_VARIABLES, resolve_run_id, run_id_from_env
from astream._coord.world import LAUNCHER_VARIABLES, LAUNCHERS, World, detect_world
from astream.errors import ConfigError, CoordinationError

LAUNCHER_VARS = (*LAUNCHER_VARIABLES, *RUN_ID_VARIABLES)


@pytest.fixture
def env(monkeypatch: pytest.MonkeyPatch) -> pytest.MonkeyPatch:
    for name in LAUNCHER_VARS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.delitem(sys.modules, "jax", raising=False)
    return monkeypatch


def _set(mp: pytest.MonkeyPatch, **values: str) -> None:
    for name, value in values.items():
        mp.setenv(name, value)


def _place(world: World) -> tuple[int, int, int, int]:
    return world.rank, world.world_size, world.local_rank, world.ranks_per_node


def _fake_jax(mp: pytest.MonkeyPatch, index: int, count: int) -> None:
    fake = types.SimpleNamespace(distributed=types.SimpleNamespace(is_initialized=lambda: True),
                                 process_index=lambda: index, process_count=lambda: count)
    mp.setitem(sys.modules, "jax", fake)


def test_the_documented_order() -> None:
    assert [name for name, _ in LAUNCHERS] == ["torchrun", "jax.distributed", "SLURM", "Open MPI", "PMI", "TF_CONFIG"]


def test_nothing_set_is_a_single_process(env: pytest.MonkeyPatch) -> None:
    world, source = detect_world()
    assert (_place(world), source) == ((0, 1, 0, 1), "single process")


def test_open_mpi(env: pytest.MonkeyPatch) -> None:
    _set(env, OMPI_COMM_WORLD_RANK="5", OMPI_COMM_WORLD_SIZE="8", OMPI_COMM_WORLD_LOCAL_RANK="1",
         OMPI_COMM_WORLD_LOCAL_SIZE="4")
    world, source = detect_world(worker=1, workers_per_rank=2)
    assert (_place(world), world.node, world.num_nodes, world.global_worker, source) == ((5, 8, 1, 4), 1, 2, 11, "Open MPI")


def test_open_mpi_without_local_size_is_one_rank_per_node(env: pytest.MonkeyPatch) -> None:
    _set(env, OMPI_COMM_WORLD_RANK="2", OMPI_COMM_WORLD_SIZE="3")
    assert _place(detect_world()[0]) == (2, 3, 0, 1)


@pytest.mark.parametrize(
    ("local", "expected"),
    [({"MPI_LOCALRANKID": "2", "MPI_LOCALNRANKS": "3"}, (5, 6, 2, 3)),  # hydra: MPICH, Intel MPI
     ({"PMI_LOCAL_RANK": "1", "PMI_LOCAL_SIZE": "2"}, (5, 6, 1, 2)),  # Cray and other PMIs
     ({}, (5, 6, 0, 1))],
)
def test_pmi(env: pytest.MonkeyPatch, local: dict[str, str], expected: tuple[int, ...]) -> None:
    _set(env, PMI_RANK="5", PMI_SIZE="6", **local)
    world, source = detect_world()
    assert (_place(world), source) == (expected, "PMI")


@pytest.mark.parametrize(
    ("task", "rank"), [({"type": "chief", "index": 0}, 0), ({"type": "worker", "index": 0}, 1), ({"type": "worker", "index": 2}, 3)]
)
def test_tf_config(env: pytest.MonkeyPatch, task: dict[str, object], rank: int) -> None:
    cluster = {"chief": ["h0:1"], "worker": ["h1:1", "h2:1", "h3:1"], "ps": ["h4:1"]}
    _set(env, TF_CONFIG=json.dumps({"cluster": cluster, "task": task}))
    world, source = detect_world()
    assert (_place(world), source) == ((rank, 4, 0, 1), "TF_CONFIG")


def test_tf_config_with_local_world_size(env: pytest.MonkeyPatch) -> None:
    _set(env, LOCAL_WORLD_SIZE="2",
         TF_CONFIG=json.dumps({"cluster": {"worker": ["a:1", "a:2", "b:1", "b:2"]}, "task": {"type": "worker", "index": 3}}))
    assert _place(detect_world()[0]) == (3, 4, 1, 2)


@pytest.mark.parametrize(
    ("raw", "message"),
    [("{not json", "TF_CONFIG is not valid JSON"), ('{"task": {}}', "needs a 'cluster' object"),
     (json.dumps({"cluster": {"worker": ["a"], "ps": ["b"]}, "task": {"type": "ps", "index": 0}}), "task type 'ps'"),
     (json.dumps({"cluster": {"worker": ["a"]}, "task": {"type": "worker", "index": 1}}), "TF_CONFIG.*rank 1 is outside")],
)
def test_bad_tf_config_is_named(env: pytest.MonkeyPatch, raw: str, message: str) -> None:
    _set(env, TF_CONFIG=raw)
    with pytest.raises(ConfigError, match=message):
        detect_world()


@pytest.mark.parametrize(
    ("values", "message"),
    [({"OMPI_COMM_WORLD_RANK": "1"}, "OMPI_COMM_WORLD_SIZE is missing"),
     ({"PMI_RANK": "x", "PMI_SIZE": "2"}, "PMI_RANK='x' is not an integer"),
     ({"PMI_RANK": "3", "PMI_SIZE": "4", "MPI_LOCALRANKID": "0", "MPI_LOCALNRANKS": "2"},
      "PMI_RANK/PMI_SIZE/MPI_LOCALRANKID/MPI_LOCALNRANKS")],
)
def test_inconsistent_mpi_variables_are_named(env: pytest.MonkeyPatch, values: dict[str, str], message: str) -> None:
    _set(env, **values)
    with pytest.raises(ConfigError, match=message):
        detect_world()


def test_each_launcher_wins_over_the_ones_after_it(env: pytest.MonkeyPatch) -> None:
    # Set every launcher at once (each saying a different world), then remove them in order.
    _set(env, TF_CONFIG=json.dumps({"cluster": {"worker": ["a", "b"]}, "task": {"type": "worker", "index": 1}}))
    assert detect_world()[1] == "TF_CONFIG"
    _set(env, PMI_RANK="2", PMI_SIZE="3")
    assert detect_world()[1] == "PMI"
    _set(env, OMPI_COMM_WORLD_RANK="3", OMPI_COMM_WORLD_SIZE="4")
    assert detect_world()[1] == "Open MPI"
    _set(env, SLURM_PROCID="4", SLURM_NTASKS="5")
    assert detect_world()[1] == "SLURM"
    _fake_jax(env, 5, 6)
    assert (_place(detect_world()[0]), detect_world()[1]) == ((5, 6, 0, 1), "jax.distributed")
    _set(env, RANK="6", WORLD_SIZE="7")
    assert (_place(detect_world()[0]), detect_world()[1]) == ((6, 7, 0, 1), "torchrun")
    assert World.from_env().rank == 6  # the same answer through World.from_env


# --- the run id ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("values", "source"),
    [({"ASTREAM_RUN_ID": "mine", "TORCHELASTIC_RUN_ID": "t"}, "ASTREAM_RUN_ID"),
     ({"TORCHELASTIC_RUN_ID": "t", "SLURM_JOB_ID": "9"}, "TORCHELASTIC_RUN_ID"),
     ({"PMIX_NAMESPACE": "prterun-host-1234@1"}, "PMIX_NAMESPACE"),
     ({"OMPI_MCA_ess_base_jobid": "4242"}, "OMPI_MCA_ess_base_jobid"),
     ({"MASTER_ADDR": "h", "MASTER_PORT": "1"}, "MASTER_ADDR:MASTER_PORT")],
)
def test_run_id_sources(env: pytest.MonkeyPatch, values: dict[str, str], source: str) -> None:
    _set(env, **values)
    run_id, found = run_id_from_env()
    assert found == source
    assert run_id


def test_tf_config_run_id_is_the_clusters_not_the_tasks(env: pytest.MonkeyPatch) -> None:
    cluster = {"worker": ["a:1", "b:1"]}
    ids = set()
    for index in range(2):
        env.setenv("TF_CONFIG", json.dumps({"cluster": cluster, "task": {"type": "worker", "index": index}}))
        ids.add(run_id_from_env())
    assert len(ids) == 1
    assert next(iter(ids))[1] == "TF_CONFIG"
    env.setenv("TF_CONFIG", json.dumps({"cluster": {"worker": ["c:1"]}, "task": {"type": "worker", "index": 0}}))
    assert run_id_from_env() not in ids  # another job, another id


def test_run_id_rule(env: pytest.MonkeyPatch) -> None:
    assert resolve_run_id("given", 8) == ("given", "run_id=")
    solo, source = resolve_run_id(None, 1)
    assert solo.startswith("solo-")
    assert source == "none (one rank per node)"
    assert resolve_run_id(None, 1)[0] != solo  # two single-process jobs never meet
    with pytest.raises(CoordinationError, match=r"2 ranks share this node.*Set ASTREAM_RUN_ID.*TORCHELASTIC_RUN_ID"):
        resolve_run_id(None, 2)
    env.setenv("SLURM_JOB_ID", "31")
    assert resolve_run_id(None, 2) == ("SLURM_JOB_ID=31.", "SLURM_JOB_ID")
