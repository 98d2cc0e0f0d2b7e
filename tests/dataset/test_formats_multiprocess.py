"""Parquet and WebDataset streams read by real processes: 2 simulated nodes x 2 ranks x 2
workers over loopback HTTP (with the written index), then a resumption on 1 node x 4 ranks."""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
from pathlib import Path

import parquet_data as data
import pytest
from test_webdataset_streams import write_tar

from astream.cli import main as cli
from astream.testing import LoopbackServer

RANK = Path(__file__).with_name("format_rank.py")


def _launch(nodes: int, per_node: int, tmp: Path, url: str, truth: Path, run: str, **flags: object) -> list[dict]:
    procs, outs = [], []
    for rank in range(nodes * per_node):
        out = tmp / f"{run}-rank{rank}.json"
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": str(nodes * per_node),
               "LOCAL_RANK": str(rank % per_node), "LOCAL_WORLD_SIZE": str(per_node), "ASTREAM_RUN_ID": run}
        cmd = [sys.executable, str(RANK), "--remote", url, "--truth", str(truth), "--cache", str(tmp / "cache"),
               "--out", str(out)]
        for key, value in flags.items():
            cmd += [f"--{key}", str(value)]
        procs.append(subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, text=True))
        outs.append(out)
    for proc in procs:
        _, err = proc.communicate(timeout=240)
        assert proc.returncode == 0, err
    return [json.loads(o.read_text()) for o in outs]


@pytest.mark.slow
@pytest.mark.timeout(300)  # 12 rank processes and their workers, on a shared 2-core machine
@pytest.mark.parametrize("fmt", ["parquet", "webdataset"])
def test_two_nodes_two_ranks_two_workers_then_resume_on_four_ranks(fmt: str, tmp_path: Path) -> None:
    root = tmp_path / "data"
    if fmt == "parquet":
        data.write(root, files=2, groups=(1000, 300))
        total = 2 * 1300
    else:  # smaller: 6 tars
        root.mkdir()
        for k in range(6):
            write_tar(root / f"shard-{k:03d}.tar{'.gz' if k % 2 else ''}", k * 100, 100)
        total = 600
    assert cli(["-q", "index", str(root)]) == 0
    with LoopbackServer(str(root)) as server:
        full = _launch(2, 2, tmp_path, server.url, root, "full", workers=2, format=fmt)
        assert all(not r["bad"] for r in full)
        seen = collections.Counter(i for r in full for i in r["ids"])
        assert len(seen) == total
        assert sum(seen.values()) - total < 4 * 16  # padding repeats at most a batch per rank
        part = _launch(2, 2, tmp_path, server.url, root, "part", workers=2, take=5, format=fmt)
        states = [r["state"] for r in part]
        assert all(s == states[0] for s in states)
        state = tmp_path / "state.json"
        state.write_text(json.dumps(states[0]))
        rest = _launch(1, 4, tmp_path, server.url, root, "rest", workers=1, resume=state, format=fmt)
    assert all(not r["bad"] for r in part + rest)
    before = collections.Counter(i for r in part for i in r["ids"])
    after = collections.Counter(i for r in rest for i in r["ids"])
    assert sum(before.values()) == 4 * 5 * 16
    assert not set(before) & set(after), "a row was repeated across the resumption"
    assert len(set(before) | set(after)) == total
