"""Real processes: simulated nodes, ranks and loader workers against a loopback HTTP server."""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from astream import MDSWriter
from astream._coord.world import World
from astream._dataset.dataset import StreamingDataset
from astream.testing import LoopbackServer

RANK_MAIN = Path(__file__).with_name("rank_main.py")
NUM_SAMPLES = 997


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("remote")
    with MDSWriter(out=str(root), columns={"id": "int64", "x": "ndarray:uint8:16"}, compression="zstd",
                   size_limit="2kb") as writer:
        for i in range(NUM_SAMPLES):
            writer.write({"id": i, "x": np.full(16, i % 251, np.uint8)})
    with LoopbackServer(str(root)) as server:
        yield server


def _launch(nodes: int, per_node: int, tmp: Path, remote: str, run: str, **flags: object) -> list[dict]:
    procs, outs = [], []
    for rank in range(nodes * per_node):
        out = tmp / f"{run}-rank{rank}.json"
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": str(nodes * per_node),
               "LOCAL_RANK": str(rank % per_node), "LOCAL_WORLD_SIZE": str(per_node),
               "ASTREAM_RUN_ID": run}
        cmd = [sys.executable, str(RANK_MAIN), "--remote", remote, "--cache", str(tmp / "cache"),
               "--out", str(out)]
        for key, value in flags.items():
            if value is not None:
                cmd += [f"--{key.replace('_', '-')}", str(value)]
        procs.append(subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, text=True))
        outs.append(out)
    for proc in procs:
        _, err = proc.communicate(timeout=240)
        assert proc.returncode == 0, err
    return [json.loads(o.read_text()) for o in outs]


def _expected(nodes: int, per_node: int, workers: int, tmp: Path, served: LoopbackServer) -> list[list[int]]:
    """Each rank's order according to the epoch plan (computed without reading any data)."""
    out = []
    for rank in range(nodes * per_node):
        world = World(rank=rank, world_size=nodes * per_node, local_rank=rank % per_node, ranks_per_node=per_node)
        ds = StreamingDataset(remote=served.url, local=str(tmp / "plan"), shuffle=True, shuffle_seed=7,
                              batch_size=4, world=world, run_id="plan")
        plan = ds.plan(epoch=0, sample_in_epoch=0, workers_per_rank=max(1, workers))
        out.append(plan.rank_order(world.node, world.local_rank).tolist())
    return out


@pytest.mark.slow
def test_two_nodes_two_ranks_two_workers_then_resume_on_one_node_of_four(tmp_path: Path, served: LoopbackServer) -> None:
    before = served.count()
    full = _launch(2, 2, tmp_path, served.url, "full", workers=2)
    expected = _expected(2, 2, 2, tmp_path, served)
    assert [r["ids"] for r in full] == expected
    seen = collections.Counter(i for r in full for i in r["ids"])
    assert set(seen) == set(range(NUM_SAMPLES))
    # padding may repeat a few ids, never more than once each
    assert sum(seen.values()) - NUM_SAMPLES < 2 * 2 * 4
    # each simulated node fetched each shard once (plus index.json per rank)
    shards = len(json.loads((Path(served.root) / "index.json").read_text())["shards"])
    assert served.count() - before <= 2 * shards + 4

    # Stop mid-epoch (5 batches per rank), resume with 1 node x 4 ranks x 1 worker.
    part = _launch(2, 2, tmp_path, served.url, "part", workers=2, take=5)
    states = [r["state"] for r in part]
    assert all(s == states[0] for s in states)
    assert states[0]["sample_in_epoch"] == 5 * 4 * 4
    state_file = tmp_path / "state.json"
    state_file.write_text(json.dumps(states[0]))
    rest = _launch(1, 4, tmp_path, served.url, "rest", workers=1, resume=state_file)
    before_ids = collections.Counter(i for r in part for i in r["ids"])
    after_ids = collections.Counter(i for r in rest for i in r["ids"])
    assert set(before_ids) | set(after_ids) == set(range(NUM_SAMPLES))
    assert not set(before_ids) & set(after_ids), "a sample was repeated across the resumption"


def test_replicas_see_identical_batches_as_the_peer_recorded(fixtures_dir: Path, tmp_path: Path) -> None:
    """Two nodes of two ranks with ``replication=2``, each rank a process: the pairs of
    replicas get the same batches, and each rank yields what mosaicml-streaming's did."""
    cases = json.loads((fixtures_dir / "orders" / "replication.json").read_text())["cases"]
    case = next(c for c in cases if c["name"] == "two_nodes_r2_py2s")
    cfg = case["cfg"]
    (layout,) = cfg["streams"]
    options = {k: cfg[k] for k in ("shuffle", "shuffle_algo", "shuffle_seed", "num_canonical_nodes",
                                   "partition_algo", "batch_size", "replication")}
    with LoopbackServer(str(fixtures_dir / "mds" / "layouts" / layout["layout"])) as server:
        ranks = _launch(cfg["world"]["num_physical_nodes"], cfg["world"]["ranks_per_node"], tmp_path, server.url,
                        "replicas", options=json.dumps(options))
    assert ranks[0]["batches"] == ranks[1]["batches"]
    assert ranks[2]["batches"] == ranks[3]["batches"]
    assert ranks[0]["ids"] != ranks[2]["ids"]
    assert [r["ids"] for r in ranks] == case["epochs"]["0"]["per_rank_order"]
    assert [r["len"] for r in ranks] == case["epochs"]["0"]["per_rank_len"]
