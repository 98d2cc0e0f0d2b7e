"""Datasets larger than the cache (issue #14): real loaders, a loopback HTTP remote.

Each run checks that the epoch is exact, that the shard files on disk (temporaries
included, sampled while it runs) never exceeded ``cache_limit``, and that the number of
shard downloads is what the pure simulation of the policy predicts
(:func:`astream._cache.simulation.simulate`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import logging
import os
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Iterator
from pathlib import Path

import numpy as np
import pytest
from helpers import THREAD_AGENT

from astream import Loader, MDSWriter, StreamingDataset
from astream._cache.eviction import min_cache_bytes
from astream._cache.simulation import offline_optimum, simulate
from astream._coord.world import World
from astream._dataset.runtime import portal
from astream.errors import CacheError, CacheWarning
from astream.testing import LoopbackServer

SAMPLES = 400
BATCH = 4
RANK = Path(__file__).with_name("bounded_rank.py")


def write(root: Path, samples: int, size_limit: str) -> list[int]:
    with MDSWriter(out=str(root), columns={"id": "int64", "x": "bytes"}, size_limit=size_limit) as w:
        for i in range(samples):
            w.write({"id": i, "x": bytes([i % 251]) * (900 + i % 200)})
    index = json.loads((root / "index.json").read_text())
    return [s["raw_data"]["bytes"] for s in index["shards"]]


@pytest.fixture(scope="module")
def remote(tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LoopbackServer, list[int]]]:
    root = tmp_path_factory.mktemp("remote")
    sizes = write(root, SAMPLES, "10kb")
    assert 30 <= len(sizes) <= 100
    with LoopbackServer(str(root)) as server:
        yield server, sizes


class DiskWatch:
    """Samples the bytes of shard files (temporaries too) under a folder while a run goes."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        self.peak = 0
        self.samples = 0
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            total = 0
            for dirpath, _, names in os.walk(self.folder):
                for name in names:
                    if name.startswith("shard."):
                        with contextlib.suppress(FileNotFoundError):
                            total += os.stat(os.path.join(dirpath, name)).st_size
            self.peak = max(self.peak, total)
            self.samples += 1
            time.sleep(0.001)

    def __enter__(self) -> DiskWatch:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


def downloads(server: LoopbackServer, before: int = 0) -> int:
    """Whole-shard GETs the server answered (not index.json, not ranged reads)."""
    return sum(1 for r in server.log[before:] if r.method == "GET" and ".mds" in r.path and r.range is None)


def order_of(ds: StreamingDataset, workers: int = 1, rank: int = 0) -> list[int]:
    plan = ds.plan(epoch=0, sample_in_epoch=0, workers_per_rank=workers)
    return plan.rank_order(0, rank).tolist()


def shards_of(ds: StreamingDataset, workers: int, ranks: int) -> list[np.ndarray]:
    """The node's readers' shard sequences (each worker of each rank), from the plan."""
    out = []
    plan = ds.plan(epoch=0, sample_in_epoch=0, workers_per_rank=workers)
    for rank in range(ranks):
        for w in range(workers):
            ids = plan.worker_ids(0, rank, w)
            out.append(plan.shard_of(ids[ids >= 0]))
    return out


def limit_for(sizes: list[int], what: str, readers: int = 1) -> int:
    if what.endswith("x"):  # batches' worth: the minimum times this
        return int(min_cache_bytes(sizes, BATCH, readers) * float(what[:-1]))
    return int(sum(sizes) * float(what))  # a fraction of the dataset


async def agent_stats(ds: StreamingDataset) -> dict:
    return (await (await ds.node()).stats())["provider"]


@pytest.mark.timeout(30)
def test_issue_14_repro_finishes(tmp_path: Path) -> None:
    """200 samples of 1 KB, batch 10, shuffled, cache_limit=100kb: it hung after one batch."""
    sizes = write(tmp_path / "remote", 200, "9kb")
    with LoopbackServer(str(tmp_path / "remote")) as server:
        ds = StreamingDataset(remote=server.url, local=str(tmp_path / "cache"), batch_size=10, shuffle=True,
                              cache_limit="100kb")
        with warnings.catch_warnings():
            warnings.simplefilter("ignore", CacheWarning)
            ids = [int(i) for batch in Loader(ds) for i in batch["id"]]
        ds.close()
    assert sorted(ids) == list(range(200))
    assert sum(sizes) > 100_000
    assert downloads(server) > len(sizes)  # it did evict and fetch again


CASES = [(algo, "1x") for algo in ("py1e", "py1s", "py1b", "py1br", "py2s", "naive")]
CASES += [(algo, "0.25") for algo in ("py1e", "py1br", "naive")]
CASES += [("py1e", what) for what in ("2x", "4x", "0.5")]


@pytest.mark.parametrize(("algo", "what"), CASES)
@pytest.mark.filterwarnings("ignore::astream.errors.CacheWarning")
def test_one_reader_downloads_what_the_simulation_predicts(
    tmp_path: Path, remote: tuple[LoopbackServer, list[int]], algo: str, what: str
) -> None:
    server, sizes = remote
    limit = limit_for(sizes, what)
    assert limit >= min_cache_bytes(sizes, BATCH, 1)
    # predownload = one batch: no node prefetch, so the transfers are deterministic
    ds = StreamingDataset(remote=server.url, local=str(tmp_path / "cache"), batch_size=BATCH, shuffle=True,
                          shuffle_algo=algo, shuffle_seed=3, cache_limit=limit, predownload=BATCH)
    before = len(server.log)
    with DiskWatch(tmp_path / "cache") as disk:
        ids = [int(i) for batch in Loader(ds) for i in batch["id"]]
    stats = portal().call(agent_stats(ds))
    ds.close()
    assert ids == order_of(ds)
    assert disk.samples > 0
    assert disk.peak <= limit
    sim = simulate(shards_of(ds, 1, 1), sizes, limit, batch_size=BATCH, predownload=BATCH)
    got = downloads(server, before)
    assert got == sim.downloads == stats["shards_downloaded"]
    assert stats["evictions"] == sim.evictions
    assert stats["epoch_bytes_downloaded"] == sim.bytes_downloaded  # uncompressed shards: bytes = sizes
    assert stats["redownloads"] == got - len({int(s) for s in shards_of(ds, 1, 1)[0]})
    assert stats["peak_cache_bytes"] <= limit


@pytest.mark.filterwarnings("ignore::astream.errors.CacheWarning")
def test_prefetching_ahead_stays_near_the_offline_optimum(tmp_path: Path, remote: tuple[LoopbackServer, list[int]]) -> None:
    server, sizes = remote
    limit = limit_for(sizes, "0.25")
    ds = StreamingDataset(remote=server.url, local=str(tmp_path / "cache"), batch_size=BATCH, shuffle=True,
                          shuffle_seed=3, cache_limit=limit, predownload=16 * BATCH)
    before = len(server.log)

    async def main() -> list[int]:
        out = [int(i) async for batch in Loader(ds) for i in batch["id"]]
        await ds.aclose()
        return out

    with DiskWatch(tmp_path / "cache") as disk:
        ids = asyncio.run(main())
    assert ids == order_of(ds)
    assert disk.peak <= limit
    opt = offline_optimum(shards_of(ds, 1, 1), sizes, limit, batch_size=BATCH)
    got = downloads(server, before)
    assert opt.downloads <= got <= 1.1 * opt.downloads


@pytest.mark.filterwarnings("ignore::astream.errors.CacheWarning")
def test_direct_iteration_sync_and_async_with_random_access_between(
    tmp_path: Path, remote: tuple[LoopbackServer, list[int]]
) -> None:
    server, sizes = remote
    limit = limit_for(sizes, "1x")
    ds = StreamingDataset(remote=server.url, local=str(tmp_path / "cache"), batch_size=BATCH, shuffle=True,
                          shuffle_seed=3, cache_limit=limit)
    seen = []
    with DiskWatch(tmp_path / "cache") as disk:
        for n, sample in enumerate(ds):
            seen.append(int(sample["id"]))
            if n % 37 == 0:  # random access while the iteration holds its batch
                j = (n * 7919) % SAMPLES
                assert int(ds[j]["id"]) == j
                assert ds.get_batch([j])["id"].tolist() == [j]
        ds.close()

        async def again() -> list[int]:
            out = []
            async for sample in ds:
                out.append(int(sample["id"]))
                if len(out) % 50 == 0:
                    j = (len(out) * 31) % SAMPLES
                    assert int((await ds.aget(j))["id"]) == j
            await ds.aclose()
            return out

        second = asyncio.run(again())
    assert sorted(seen) == sorted(second) == list(range(SAMPLES))
    assert disk.peak <= limit


def test_a_limit_below_the_minimum_fails_before_any_download(tmp_path: Path, remote: tuple[LoopbackServer, list[int]]) -> None:
    server, sizes = remote
    need = min_cache_bytes(sizes, BATCH, 2)
    ds = StreamingDataset(remote=server.url, local=str(tmp_path / "cache"), batch_size=BATCH, shuffle=True,
                          cache_limit=need - 1)
    before = len(server.log)
    with pytest.raises(CacheError, match=rf"cache_limit={need - 1} bytes.*needs at least {need} bytes: 2 reader"):
        next(iter(Loader(ds, num_workers=2, worker_mode="thread")))
    ds.close()
    assert downloads(server, before) == 0
    # one reader fits in the same limit
    ds = StreamingDataset(remote=server.url, local=str(tmp_path / "cache"), batch_size=BATCH, shuffle=False,
                          cache_limit=need - 1)
    assert len(list(Loader(ds))) == SAMPLES // BATCH
    ds.close()


def test_a_limit_below_two_shards_is_a_cache_error_when_the_dataset_is_made(
    tmp_path: Path, remote: tuple[LoopbackServer, list[int]], caplog: pytest.LogCaptureFixture
) -> None:
    # The node agent's floor (one shard in use, one arriving), met before there is an agent:
    # the documented CacheError, not a CoordinationError with the agent thread's traceback.
    server, sizes = remote
    need = 2 * max(sizes)
    before = len(server.log)
    with caplog.at_level(logging.DEBUG, logger="astream"), \
            pytest.raises(CacheError, match=rf"cache_limit={need - 1} bytes, but its largest shard takes {max(sizes)} "
                                            rf"bytes.*raise cache_limit to at least {need}"):
        StreamingDataset(remote=server.url, local=str(tmp_path / "cache"), batch_size=1, cache_limit=need - 1)
    assert not [r for r in caplog.records if r.levelno >= logging.WARNING]
    assert downloads(server, before) == 0
    ds = StreamingDataset(remote=server.url, local=str(tmp_path / "cache"), batch_size=1, cache_limit=need)
    assert len(list(Loader(ds))) == SAMPLES
    ds.close()


def test_a_shuffle_wider_than_the_cache_warns_once_with_the_remedies(
    tmp_path: Path, remote: tuple[LoopbackServer, list[int]]
) -> None:
    server, sizes = remote
    ds = StreamingDataset(remote=server.url, local=str(tmp_path / "cache"), batch_size=BATCH, shuffle=True,
                          cache_limit=limit_for(sizes, "0.25"))
    loader = Loader(ds)
    with pytest.warns(CacheWarning, match=r"most reads will download a shard again.*shuffle_block_size.*cache_limit"):
        list(loader)
    with warnings.catch_warnings():
        warnings.simplefilter("error", CacheWarning)
        list(loader)  # once
    ds.close()
    # a small shuffle block fits: no warning
    ds = StreamingDataset(remote=server.url, local=str(tmp_path / "cache2"), batch_size=BATCH, shuffle=True,
                          shuffle_block_size=40, cache_limit=limit_for(sizes, "0.25"))
    with warnings.catch_warnings():
        warnings.simplefilter("error", CacheWarning)
        list(Loader(ds))
    ds.close()


@pytest.mark.filterwarnings("ignore::astream.errors.CacheWarning")
def test_resuming_mid_epoch_with_a_small_cache(tmp_path: Path, remote: tuple[LoopbackServer, list[int]]) -> None:
    server, sizes = remote
    kwargs = {"remote": server.url, "local": str(tmp_path / "cache"), "batch_size": BATCH, "shuffle": True,
              "shuffle_algo": "py1br", "cache_limit": limit_for(sizes, "1x", 2)}
    ds = StreamingDataset(**kwargs)
    loader = Loader(ds, num_workers=2, worker_mode="thread")
    first: list[int] = []
    for n, batch in enumerate(loader, start=1):
        first.extend(int(i) for i in batch["id"])
        if n == 17:
            state = loader.state_dict()
            break
    ds.close()
    ds2 = StreamingDataset(**kwargs)
    loader2 = Loader(ds2, num_workers=2, worker_mode="thread")
    loader2.load_state_dict(state)
    rest = [int(i) for batch in loader2 for i in batch["id"]]
    ds2.close()
    assert first + rest == order_of(ds, workers=2)


def _launch(server: LoopbackServer, tmp: Path, ranks: int, workers: int, limit: int, **flags: object) -> list[dict]:
    procs, outs = [], []
    for rank in range(ranks):
        out = tmp / f"rank{rank}.json"
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": str(ranks), "LOCAL_RANK": str(rank),
               "LOCAL_WORLD_SIZE": str(ranks), "ASTREAM_RUN_ID": tmp.name, "BOUNDED_WAIT": "1"}
        cmd = [sys.executable, str(RANK), "--remote", server.url, "--cache", str(tmp / "cache"), "--out", str(out),
               "--workers", str(workers), "--batch-size", str(BATCH), "--limit", str(limit)]
        for key, value in flags.items():
            if key == "env":
                env.update(value)  # type: ignore[arg-type]
            elif value is not None:
                cmd += [f"--{key.replace('_', '-')}", str(value)]
        procs.append(subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, text=True))
        outs.append(out)
    results = []
    for proc, out in zip(procs, outs, strict=True):
        _, err = proc.communicate(timeout=120)
        results.append({"returncode": proc.returncode, "err": err, **(json.loads(out.read_text()) if out.exists() else {})})
    return results


@pytest.mark.slow
@pytest.mark.parametrize(("ranks", "workers", "algo"), [(2, 2, "py1e"), (3, 0, "py1s")])
def test_ranks_and_workers_processes_share_one_limit(
    tmp_path: Path, remote: tuple[LoopbackServer, list[int]], ranks: int, workers: int, algo: str
) -> None:
    server, sizes = remote
    readers = ranks * max(1, workers)
    limit = limit_for(sizes, "1x", readers)
    before = len(server.log)
    with DiskWatch(tmp_path / "cache") as disk:
        results = _launch(server, tmp_path, ranks, workers, limit, algo=algo)
    assert all(r["returncode"] == 0 for r in results), [r["err"] for r in results]
    probe = StreamingDataset(remote=server.url, local=str(tmp_path / "probe"), batch_size=BATCH, shuffle=True,
                             shuffle_seed=7, shuffle_algo=algo,
                             world=World(rank=0, world_size=ranks, local_rank=0, ranks_per_node=ranks),
                             run_id="probe")  # a plan only; it joins no node
    w = max(1, workers)
    assert [r["ids"] for r in results] == [order_of(probe, w, rank) for rank in range(ranks)]
    assert disk.peak <= limit
    stats = results[0]["stats"]["provider"]
    assert stats["peak_cache_bytes"] <= limit
    got = downloads(server, before)
    # a transfer cancelled on the way (a prefetch dropped for a reader's request) was asked for
    assert stats["shards_downloaded"] <= got <= stats["shards_downloaded"] + stats["cancelled"]
    # ranks run concurrently, so transfers are not those of the lockstep simulation exactly
    sim = simulate(shards_of(probe, w, ranks), sizes, limit, batch_size=BATCH, predownload=8 * BATCH)
    assert got <= 1.5 * sim.downloads, (got, sim.downloads)


@pytest.mark.filterwarnings("ignore::astream.errors.CacheWarning")
def test_eight_ranks_on_one_node(tmp_path: Path, remote: tuple[LoopbackServer, list[int]]) -> None:
    """Eight ranks of one node in one process (one agent thread), each its own dataset."""
    server, sizes = remote
    limit = limit_for(sizes, "1x", 8)
    datasets = [
        StreamingDataset(remote=server.url, local=str(tmp_path / "cache"), batch_size=BATCH, shuffle=True,
                         cache_limit=limit, run_id="eight", coord=THREAD_AGENT,
                         world=World(rank=r, world_size=8, local_rank=r, ranks_per_node=8))
        for r in range(8)
    ]

    async def main() -> list[list[int]]:
        async def one(ds: StreamingDataset) -> list[int]:
            out = [int(i) async for batch in Loader(ds) for i in batch["id"]]
            return out

        try:
            return list(await asyncio.gather(*(one(ds) for ds in datasets)))
        finally:
            for ds in datasets:
                await ds.aclose()

    with DiskWatch(tmp_path / "cache") as disk:
        got = asyncio.run(asyncio.wait_for(main(), 60))
    assert got == [order_of(datasets[0], 1, r) for r in range(8)]
    assert disk.peak <= limit


@pytest.mark.slow
def test_a_killed_rank_releases_its_pins_and_plan(tmp_path: Path, remote: tuple[LoopbackServer, list[int]]) -> None:
    server, sizes = remote
    limit = limit_for(sizes, "1x", 2)
    procs = []
    for rank in range(2):
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_RANK": str(rank),
               "LOCAL_WORLD_SIZE": "2", "ASTREAM_RUN_ID": tmp_path.name}
        cmd = [sys.executable, str(RANK), "--remote", server.url, "--cache", str(tmp_path / "cache"),
               "--out", str(tmp_path / f"rank{rank}.json"), "--batch-size", str(BATCH), "--limit", str(limit)]
        if rank == 1:
            cmd += ["--die-after", "3"]
        procs.append(subprocess.Popen(cmd, env=env, stderr=subprocess.PIPE, text=True))
    errs = [p.communicate(timeout=120)[1] for p in procs]
    assert procs[1].returncode == -9
    assert procs[0].returncode == 0, errs[0]
    out = json.loads((tmp_path / "rank0.json").read_text())
    assert out["stats"]["pins"] == 0  # rank 1's pins went with its connection
    assert out["stats"]["provider"]["plan_readers"] == 0  # and so did its plan
