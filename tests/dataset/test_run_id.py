"""The run id rule at dataset construction: several ranks per node need one, a lone rank does not.

Without a run id, ranks started by hand would each elect themselves leader of their own
node agent, and the first barrier would time out minutes later; the dataset refuses at
once instead, naming the variables that give one.
"""

from __future__ import annotations

import json
import logging
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from astream import MDSWriter, StreamingDataset, World
from astream._coord.rendezvous import RUN_ID_VARIABLES
from astream._coord.world import LAUNCHER_VARIABLES
from astream.errors import CoordinationError

LAUNCHER_VARS = (*LAUNCHER_VARIABLES, *RUN_ID_VARIABLES)

_RANK = """
import json, sys
from astream import StreamingDataset
from astream.errors import CoordinationError
try:
    ds = StreamingDataset(remote=sys.argv[1], local=sys.argv[2], batch_size=4)
except CoordinationError as exc:
    print(json.dumps({"error": str(exc)}))
    sys.exit(3)
print(json.dumps({"rank": ds.config.world.rank, "per_node": ds.config.world.ranks_per_node,
                  "ids": [int(s["id"]) for s in ds]}))
ds.close()
"""


@pytest.fixture
def dataset(tmp_path: Path) -> Path:
    root = tmp_path / "ds"
    with MDSWriter(root, {"id": "int64"}, size_limit=200) as writer:
        for i in range(40):
            writer.write({"id": i})
    return root


def _clean_env() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k not in LAUNCHER_VARS}


def _launch(dataset: Path, cache: Path, extra: dict[str, str]) -> list[tuple[int, dict[str, object]]]:
    """Two ranks of one node under Open MPI's variables, started by hand."""
    procs = []
    for rank in range(2):
        env = {**_clean_env(), "OMPI_COMM_WORLD_RANK": str(rank), "OMPI_COMM_WORLD_SIZE": "2",
               "OMPI_COMM_WORLD_LOCAL_RANK": str(rank), "OMPI_COMM_WORLD_LOCAL_SIZE": "2", **extra}
        procs.append(subprocess.Popen([sys.executable, "-c", _RANK, str(dataset), str(cache)], env=env,
                                      stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
    results = []
    for proc in procs:
        out, err = proc.communicate(timeout=60)
        assert out.strip(), err[-2000:]
        results.append((proc.returncode, json.loads(out.strip().splitlines()[-1])))
    return results


def test_ranks_started_by_hand_without_a_run_id_fail_at_once(dataset: Path, tmp_path: Path) -> None:
    start = time.monotonic()
    results = _launch(dataset, tmp_path / "cache", {})
    assert time.monotonic() - start < 30  # at construction, not after a barrier's timeout
    for code, out in results:
        assert code == 3
        assert "2 ranks share this node" in str(out["error"])
        assert "ASTREAM_RUN_ID" in str(out["error"])


def test_the_same_ranks_run_under_the_launchers_job_id(dataset: Path, tmp_path: Path) -> None:
    # Open MPI 5 / PMIx exports PMIX_NAMESPACE to every rank of the job: their run id.
    results = _launch(dataset, tmp_path / "cache", {"PMIX_NAMESPACE": f"job-{os.getpid()}-{time.time_ns()}"})
    assert [code for code, _ in results] == [0, 0]
    ids = [out["ids"] for _, out in results]
    assert all(out["per_node"] == 2 for _, out in results)
    assert sorted(ids[0] + ids[1]) == list(range(40))  # one epoch split between the two ranks


def test_an_explicit_multi_rank_world_needs_a_run_id(dataset: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for name in LAUNCHER_VARS:
        monkeypatch.delenv(name, raising=False)
    world = World(rank=1, world_size=2, local_rank=1, ranks_per_node=2)
    with pytest.raises(CoordinationError, match="ASTREAM_RUN_ID"):
        StreamingDataset(remote=str(dataset), local=str(tmp_path / "c"), world=world)
    assert StreamingDataset(remote=str(dataset), local=str(tmp_path / "c"), world=world, run_id="r").run_id == "r"
    monkeypatch.setenv("ASTREAM_RUN_ID", "from-env")
    assert StreamingDataset(remote=str(dataset), local=str(tmp_path / "c"), world=world).run_id == "from-env"


def test_a_single_process_needs_none_and_the_detection_is_logged_once(
    dataset: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    for name in LAUNCHER_VARS:
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("SLURM_PROCID", "0")
    monkeypatch.setenv("SLURM_NTASKS", "1")
    with caplog.at_level(logging.DEBUG, logger="astream.coord"):
        first = StreamingDataset(remote=str(dataset), local=str(tmp_path / "c"))
        StreamingDataset(remote=str(dataset), local=str(tmp_path / "c"), run_id=first.run_id)
    assert first.run_id.startswith("solo-")
    lines = [r.getMessage() for r in caplog.records if r.name == "astream.coord" and "world from" in r.getMessage()]
    assert lines[0].startswith("world from SLURM: rank 0 of 1, node 0 of 1, local rank 0 of 1; run id 'solo-")
    assert lines[0].endswith("from none (one rank per node)")
    assert len(lines) == 2  # the second dataset's run id came from run_id=: a new outcome, said once
    with caplog.at_level(logging.DEBUG, logger="astream.coord"):
        StreamingDataset(remote=str(dataset), local=str(tmp_path / "c"), run_id=first.run_id)
    assert len([r for r in caplog.records if "world from" in r.getMessage()]) == 2
