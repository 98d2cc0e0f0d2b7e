"""on_bad_sample="skip" across real processes: 2 simulated nodes x 2 ranks x 2 worker
processes over loopback HTTP, three MDS streams with a fault each and a transform that
raises on one sample: every rank yields its planned batches, the same on a rerun and
after a resume from a state taken past a bad sample; each bad sample is reported once."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import bad_data as bd
import numpy as np
import pytest
from bad_rank import ODD, STREAMS

from astream._sampling.substitute import in_batch
from astream.testing import LoopbackServer

RANK = Path(__file__).with_name("bad_rank.py")
PER_STREAM = 100
NODES, PER_NODE = 2, 2


def _plant(root: Path) -> dict[str, set[int]]:
    """The three streams; returns the global ids each fault makes bad."""
    shards = {}
    for k, name in enumerate(STREAMS):
        shards[name] = bd.write_mds(root / name, PER_STREAM, first=k * PER_STREAM, hashes=["xxh64"],
                                    compression="zstd" if name == "zstd" else None)
    bd.corrupt_mds_record(root / "zstd", 13)
    cut, flipped = shards["truncated"][2], shards["flipped"][1]
    bd.truncate_file(root / "truncated" / cut["raw_data"]["basename"])
    bd.flip_byte(root / "flipped" / flipped["raw_data"]["basename"])

    def ids_of(name: str, shard: int) -> set[int]:
        first = STREAMS.index(name) * PER_STREAM + sum(s["samples"] for s in shards[name][:shard])
        return set(range(first, first + shards[name][shard]["samples"]))

    return {"record": {13}, "transform": {ODD}, "truncated": ids_of("truncated", 2), "flipped": ids_of("flipped", 1)}


def _plant_other(root: Path, kind: str) -> set[int]:
    """One stream of ``kind`` with its fault; returns the ids it makes bad."""
    if kind == "jsonl":
        (root / kind).mkdir(parents=True)
        bd.write_jsonl(root / kind, 160, 37)
        return {37}
    if kind == "parquet":
        bd.plant_parquet(root / kind, (40, 40, 40, 40), bad_group=2)
        return set(range(80, 120))
    bd.plant_webdataset(root / kind, 4, 40, cut_in=95)
    return set(range(80, 120))  # (the cut tar is lost whole: its size is not the index's)


def _launch(tmp: Path, url: str, run: str, **flags: object) -> list[dict[str, Any]]:
    procs, outs = [], []
    for rank in range(NODES * PER_NODE):
        out = tmp / f"{run}-rank{rank}.json"
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": str(NODES * PER_NODE), "LOCAL_RANK": str(rank % PER_NODE),
               "LOCAL_WORLD_SIZE": str(PER_NODE), "ASTREAM_RUN_ID": run}
        cmd = [sys.executable, str(RANK), "--remote", url, "--cache", str(tmp / f"cache-{run}"), "--out", str(out)]
        for key, value in flags.items():
            cmd += [f"--{key}", str(value)]
        procs.append(subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, text=True))
        outs.append(out)
    results = []
    try:
        for proc, out in zip(procs, outs, strict=True):
            _, err = proc.communicate(timeout=240)
            assert proc.returncode == 0, err
            result = json.loads(out.read_text())
            result["lines"] = [line for line in err.splitlines() if "on_bad_sample='skip'" in line]
            results.append(result)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
    return results


def _check_rule(planned: list[list[int]], got: list[list[int]], bad: set[int]) -> None:
    assert [len(b) for b in got] == [len(b) for b in planned]
    for want, have in zip(planned, got, strict=True):
        src = in_batch(np.isin(want, list(bad)))
        if src is None:
            assert len(set(have)) == 1
            assert have[0] not in bad
        else:
            assert have == [want[s] for s in src]


@pytest.mark.slow
@pytest.mark.timeout(600)  # 4 launches of 4 ranks with 2 worker processes each, on a shared 2-core machine
def test_two_nodes_two_ranks_with_worker_processes_skip_alike_everywhere(tmp_path: Path) -> None:
    root = tmp_path / "remote"
    faults = _plant(root)
    bad = set().union(*faults.values())
    with LoopbackServer(str(root)) as server:
        full = _launch(tmp_path, server.url, "full")
        again = _launch(tmp_path, server.url, "again")
        part = _launch(tmp_path, server.url, "part", take=6)
        for rank, result in enumerate(part):
            (tmp_path / f"state.rank{rank}.json").write_text(json.dumps(result["state"]))
        rest = _launch(tmp_path, server.url, "rest", resume=tmp_path / "state.json")
    assert all(r["error"] is None for r in full + again + part + rest)
    counts = {len(r["got"]) for r in full}
    assert len(counts) == 1  # every rank the same number of batches: nobody waits at a collective
    for r in full:
        _check_rule(r["planned"], r["got"], bad)
    assert [r["got"] for r in again] == [r["got"] for r in full]
    assert [r["got"] + s["got"] for r, s in zip(part, rest, strict=True)] == [r["got"] for r in full]
    assert any(r["state"]["astream_quarantine"]["ids"] for r in part)  # a state past a bad sample
    # Each bad sample met is recorded by the one rank that has it, and logged once.
    met = [{q[0] for q in r["quarantined"]} for r in full]
    assert set().union(*met) == {i for r in full for b in r["planned"] for i in b} & bad
    assert sum(len(m) for m in met) == len(set().union(*met))
    single = [line for r in full for line in r["lines"] if "a substitute takes its place" in line]
    assert sorted(single) == sorted(set(single))
    assert len(single) == len({13, ODD} & set().union(*met))
    assert all(f"{name}" in " ".join(line for r in full for line in r["lines"])
               for name in ("ValueError", "EncodingError", "SizeMismatchError", "HashMismatchError"))
    # The resumed run does not read again what its state recorded.
    known = set().union(*(set(r["state"]["astream_quarantine"]["ids"]) for r in part))
    assert not [line for r in rest for line in r["lines"] if any(f"sample {i} of" in line for i in known)]


@pytest.mark.slow
@pytest.mark.timeout(600)
@pytest.mark.filterwarnings("ignore::astream.errors.LayoutWarning")
@pytest.mark.parametrize("kind", ["jsonl", "parquet", "webdataset"])
def test_each_format_skips_alike_on_every_rank_rerun_and_resume(kind: str, tmp_path: Path) -> None:
    root = tmp_path / "remote"
    bad = _plant_other(root, kind)
    with LoopbackServer(str(root)) as server:
        full = _launch(tmp_path, server.url, "full", kind=kind)
        again = _launch(tmp_path, server.url, "again", kind=kind)
        part = _launch(tmp_path, server.url, "part", take=3, kind=kind)
        for rank, result in enumerate(part):
            (tmp_path / f"state.rank{rank}.json").write_text(json.dumps(result["state"]))
        rest = _launch(tmp_path, server.url, "rest", resume=tmp_path / "state.json", kind=kind)
    assert all(r["error"] is None for r in full + again + part + rest)
    assert len({len(r["got"]) for r in full}) == 1
    for r in full:
        _check_rule(r["planned"], r["got"], bad)
    assert [r["got"] for r in again] == [r["got"] for r in full]
    assert [r["got"] + s["got"] for r, s in zip(part, rest, strict=True)] == [r["got"] for r in full]
    met = [{q[0] for q in r["quarantined"]} for r in full]
    assert set().union(*met) == bad
    assert sum(len(m) for m in met) == len(bad)  # each recorded by one rank only


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_a_spent_budget_stops_each_rank_at_its_first_bad_sample_without_a_hang(tmp_path: Path) -> None:
    root = tmp_path / "remote"
    bad = set().union(*_plant(root).values())
    with LoopbackServer(str(root)) as server:
        runs = _launch(tmp_path, server.url, "budget", budget=0)  # (every process ends: _launch waits for all)
    stopped = 0
    for r in runs:
        first = next((k for k, b in enumerate(r["planned"]) if set(b) & bad), None)
        if first is None:
            assert r["error"] is None
            assert len(r["got"]) == len(r["planned"])
            continue
        stopped += 1
        assert r["error"].startswith("BadDataError: rank ")
        assert "more than max_bad_samples=0" in r["error"]
        assert r["got"] == r["planned"][:first]  # every batch before the first bad one, then the error
    assert stopped
