"""A changed mixture resumed by real processes over loopback HTTP (issue 36).

Rank processes (rank_main.py, launched as a job is: RANK/WORLD_SIZE/...) iterate an epoch of
mixed streams, stop mid-epoch and save the state; the next job resumes it with other weights,
an added or a removed stream, on another world. Every rank's sequence is compared with the
pure plan (astream._sampling.remix.mixed_plan over the streams' shard sizes), nothing
delivered before a change comes again, and a state taken after a second change resumes
exactly. Then the same with a Parquet and an MDS stream mixed.
"""

from __future__ import annotations

import collections
import json
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import parquet_data as data
import pytest

from astream import MDSWriter
from astream._dataset.dataset import StreamingDataset
from astream._sampling.options import PlanOptions
from astream._sampling.order import rank_batches
from astream._sampling.remix import Mixture, mixed_plan
from astream._sampling.streams import StreamSpec
from astream.cli import main as cli
from astream.testing import LoopbackServer

RANK_MAIN = Path(__file__).with_name("rank_main.py")
BATCH = 8
SEED = 7


class Job:
    """Streams served over HTTP, their labels in sample order, and the phases run so far."""

    def __init__(self, server: LoopbackServer, tmp: Path, streams: dict[str, dict]) -> None:
        self.server, self.tmp, self.streams = server, tmp, streams
        self.labels: dict[str, np.ndarray] = {}
        self.sizes: dict[str, np.ndarray] = {}
        for name, spec in streams.items():
            ds = StreamingDataset(remote=self.url(name), local=str(tmp / "labels" / name),
                                  format=spec.get("format"), columns=spec.get("columns"))
            self.sizes[name] = np.asarray(ds.sample_map.stream_shard_sizes()[0], np.int64)
            self.labels[name] = np.asarray(ds.get_batch(list(range(ds.size)))["id"], np.int64)
            ds.close()

    def url(self, name: str) -> str:
        return f"{self.server.url}/{name}"

    def launch(self, nodes: int, per_node: int, run: str, weights: dict[str, float], epoch_size: int, *,
               workers: int, take: int | None = None, resume: dict | None = None) -> list[dict]:
        streams = [{"name": n, "remote": self.url(n), "proportion": p, **self.streams[n]} for n, p in weights.items()]
        options = {"epoch_size": epoch_size, "on_mixture_change": "continue"}
        flags = ["--streams", json.dumps(streams), "--options", json.dumps(options), "--batch-size", str(BATCH),
                 "--workers", str(workers), "--cache", str(self.tmp / f"cache-{run}")]
        if take is not None:
            flags += ["--take", str(take)]
        if resume is not None:
            path = self.tmp / f"{run}-state.json"
            path.write_text(json.dumps(resume))
            flags += ["--resume", str(path)]
        procs, outs = [], []
        for rank in range(nodes * per_node):
            out = self.tmp / f"{run}-rank{rank}.json"
            env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": str(nodes * per_node),
                   "LOCAL_RANK": str(rank % per_node), "LOCAL_WORLD_SIZE": str(per_node), "ASTREAM_RUN_ID": run}
            procs.append(subprocess.Popen([sys.executable, str(RANK_MAIN), *flags, "--out", str(out)], env=env,
                                          stderr=subprocess.PIPE, text=True))
            outs.append(out)
        try:
            for proc in procs:
                _, err = proc.communicate(timeout=240)
                assert proc.returncode == 0, err
        finally:
            for proc in procs:
                if proc.poll() is None:
                    proc.kill()
        return [json.loads(o.read_text()) for o in outs]

    def mixture(self, weights: dict[str, float], epoch_size: int, start: int) -> Mixture:
        return Mixture(tuple(weights), tuple(StreamSpec(self.sizes[n], proportion=p) for n, p in weights.items()),
                       epoch_size, start)

    def expected(self, history: list[Mixture], at: int, nodes: int, per_node: int, workers: int) -> list[list[int]]:
        """Each rank's labels from ``at`` on, by the pure plan."""
        options = PlanOptions(batch_size=BATCH, shuffle=True, shuffle_seed=SEED, num_canonical_nodes=2,
                              num_physical_nodes=nodes, ranks_per_node=per_node, workers_per_rank=max(1, workers),
                              sample_in_epoch=at, initial_physical_nodes=2)
        plan = mixed_plan(history, options)
        labels = np.concatenate([self.labels[k] for k in history[-1].keys])
        out = []
        for rank in range(nodes * per_node):
            batches = rank_batches(plan, rank // per_node, rank % per_node, drop_last=False)
            ids = np.concatenate(batches) if batches else np.zeros(0, np.int64)
            out.append(labels[ids].tolist())
        return out


def check_phase(got: list[dict], expected: list[list[int]], take: int | None) -> list[int]:
    for rank, (r, want) in enumerate(zip(got, expected, strict=True)):
        assert r["ids"] == (want if take is None else want[: take * BATCH]), f"rank {rank}"
    if take is not None:
        assert all(r["state"] == got[0]["state"] for r in got)
    return [i for r in got for i in r["ids"]]


def no_repeats(before: list[int], after: list[int], ranks: int) -> None:
    assert not set(before) & set(after), "a sample delivered before the change came again"
    counts = collections.Counter(after)
    assert sum(counts.values()) - len(counts) < ranks * BATCH  # (only an epoch's end pads)


def write_mds(root: Path, n: int, base: int) -> None:
    with MDSWriter(out=str(root), columns={"id": "int64", "s": "str"}, compression="zstd", size_limit="2kb") as w:
        for i in range(n):
            w.write({"id": base + i, "s": f"m{base + i}"})


@pytest.mark.slow
@pytest.mark.timeout(600)  # 16 rank processes and their workers, on a shared 2-core machine
def test_changed_weights_an_added_and_a_removed_stream_resume_exactly(tmp_path: Path) -> None:
    root = tmp_path / "data"
    for k, (name, n) in enumerate({"a": 800, "b": 800, "c": 600}.items()):
        write_mds(root / name, n, (k + 1) * 100_000)
    with LoopbackServer(str(root)) as server:
        job = Job(server, tmp_path, {"a": {}, "b": {}, "c": {}})
        w0, w1, w2 = {"a": 0.5, "b": 0.5}, {"a": 0.7, "b": 0.1, "c": 0.2}, {"c": 0.5, "a": 0.5}
        m0 = job.mixture(w0, 1200, 0)
        # 2 nodes x 2 ranks, 2 workers each: stop after 10 batches (320 samples).
        part = job.launch(2, 2, "p0", w0, 1200, workers=2, take=10)
        seen = check_phase(part, job.expected([m0], 0, 2, 2, 2), 10)
        s1 = part[0]["state"]["sample_in_epoch"]
        assert s1 == 320
        # 1 node x 4 ranks, other weights and an added stream: 12 batches more.
        m1 = job.mixture(w1, 1200, s1)
        part1 = job.launch(1, 4, "p1", w1, 1200, workers=1, take=12, resume=part[0]["state"])
        got1 = check_phase(part1, job.expected([m0, m1], s1, 1, 4, 1), 12)
        no_repeats(seen, got1, 4)
        assert any(i >= 300_000 for i in got1)  # c contributes from its start
        s2 = part1[0]["state"]["sample_in_epoch"]
        # A second change (b removed, c and a even, a longer epoch) on 1 node x 4 ranks, stopped again.
        m2 = job.mixture(w2, 1400, s2)
        part2 = job.launch(1, 4, "p2", w2, 1400, workers=2, take=8, resume=part1[0]["state"])
        got2 = check_phase(part2, job.expected([m0, m1, m2], s2, 1, 4, 2), 8)
        no_repeats(seen + got1, got2, 4)
        assert not any(200_000 <= i < 300_000 for i in got2)  # b contributes nothing more
        # ... and that state resumes exactly on 2 nodes x 2 ranks with workers, to the epoch's end.
        state = part2[0]["state"]
        assert [m["from"] for m in state["astream_mixtures"]["history"]] == [0, s1, s2]
        rest = job.launch(2, 2, "p3", w2, 1400, workers=2, resume=state)
        got3 = check_phase(rest, job.expected([m0, m1, m2], state["sample_in_epoch"], 2, 2, 2), None)
        no_repeats(seen + got1 + got2, got3, 4)
    assert len(set(seen + got1 + got2 + got3)) == 1400


@pytest.mark.slow
@pytest.mark.timeout(600)
def test_parquet_and_mds_streams_mixed_change_and_resume_exactly(tmp_path: Path) -> None:
    root = tmp_path / "data"
    data.write(root / "pq", files=2, groups=(1000, 300))
    assert cli(["-q", "index", str(root / "pq")]) == 0
    write_mds(root / "mds", 700, 100_000)
    with LoopbackServer(str(root)) as server:
        job = Job(server, tmp_path, {"pq": {"format": "parquet", "columns": ["id", "s"]}, "mds": {}})
        w0, w1 = {"pq": 0.5, "mds": 0.5}, {"pq": 0.2, "mds": 0.8}
        m0 = job.mixture(w0, 1200, 0)
        part = job.launch(2, 2, "q0", w0, 1200, workers=2, take=9)
        seen = check_phase(part, job.expected([m0], 0, 2, 2, 2), 9)
        state = part[0]["state"]
        m1 = job.mixture(w1, 1200, state["sample_in_epoch"])
        rest = job.launch(1, 4, "q1", w1, 1200, workers=1, resume=state)
        got = check_phase(rest, job.expected([m0, m1], state["sample_in_epoch"], 1, 4, 1), None)
        no_repeats(seen, got, 4)
    assert len(set(seen + got)) == 1200
