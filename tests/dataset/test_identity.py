"""A dataset's identity and its cache folder (issue 31 items 1, 2 and 7; issue 32 findings 1 and 4).

Two datasets of one job on one ``local`` (a train and a val split) read their own samples;
a second remote on a folder is refused; a cached shard removed by someone else is fetched
again (next epoch, mid-epoch, ``ds[i]``); a shard a new run finds in the cache is checked
with ``validate_hash``. In-process first, then with ranks and worker processes (and a
``cache_limit``) over the loopback server.
"""

from __future__ import annotations

import collections
import contextlib
import glob
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from helpers import THREAD_AGENT

from astream import MDSWriter
from astream._dataset.dataset import StreamingDataset
from astream._dataset.loader import Loader
from astream.errors import ConfigError
from astream.testing import LoopbackServer

RANK = Path(__file__).with_name("identity_rank.py")
N = 480
VAL = 100_000  # val ids start here


def _write(out: Path, first: int, n: int = N, hashes: list[str] | None = None) -> None:
    with MDSWriter(out=str(out), columns={"id": "int64", "x": "ndarray:uint8:64"}, size_limit="1kb",
                   hashes=hashes) as writer:
        for i in range(first, first + n):
            writer.write({"id": i, "x": np.full(64, i % 251, np.uint8)})


@pytest.fixture(scope="module")
def remotes(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("remotes")
    _write(root / "splits" / "train", 0)
    _write(root / "splits" / "val", VAL)
    _write(root / "a", 0, hashes=["xxh64"])
    _write(root / "b", 50_000, hashes=["xxh64"])  # same shard names and sizes as a, other samples
    return {"splits": root / "splits", "a": root / "a", "b": root / "b"}


@pytest.fixture(scope="module")
def splits(remotes: dict[str, Path]):
    with LoopbackServer(str(remotes["splits"])) as server:
        yield server


def _ids(ds: StreamingDataset) -> list[int]:
    out = []
    for sample in ds:
        assert int(sample["x"][0]) == int(sample["id"]) % 251
        out.append(int(sample["id"]))
    return out


# -- issue 32 finding 1: two datasets of one job on one local -----------------------------------


def test_train_and_val_on_one_local_read_their_own_samples(tmp_path: Path, splits: LoopbackServer) -> None:
    local = str(tmp_path / "cache")
    run = {"run_id": "one-job", "coord": THREAD_AGENT}  # what a launcher's run id does
    train = StreamingDataset(remote=splits.url, local=local, split="train", **run)
    val = StreamingDataset(remote=splits.url, local=local, split="val", **run)
    try:
        assert sorted(_ids(train)) == list(range(N))
        assert sorted(_ids(val)) == list(range(VAL, VAL + N))  # (before: the train samples)
        assert int(val[3]["id"]) == VAL + 3
        assert int(train[3]["id"]) == 3
    finally:
        train.close()
        val.close()


def test_two_datasets_on_one_local_meet_at_two_agents(tmp_path: Path, splits: LoopbackServer) -> None:
    local = str(tmp_path / "cache")
    train = StreamingDataset(remote=splits.url, local=local, split="train", run_id="j", coord=THREAD_AGENT)
    again = StreamingDataset(remote=splits.url, local=local, split="train", run_id="j", coord=THREAD_AGENT)
    val = StreamingDataset(remote=splits.url, local=local, split="val", run_id="j", coord=THREAD_AGENT)
    try:
        a, b, c = (ds.session.new_client().address for ds in (train, again, val))
        assert a == b  # one dataset: one agent for all its processes
        assert a != c
    finally:
        for ds in (train, again, val):
            ds.close()


# -- issue 31 item 1: one local, two remotes --------------------------------------------------------


def test_a_second_remote_on_a_folder_is_refused(tmp_path: Path, remotes: dict[str, Path]) -> None:
    local = str(tmp_path / "cache")
    with LoopbackServer(str(remotes["a"])) as a, LoopbackServer(str(remotes["b"])) as b:
        first = StreamingDataset(remote=a.url, local=local)
        try:
            assert sorted(_ids(first)) == list(range(N))
            with pytest.raises(ConfigError, match="Reused local directory") as live:
                StreamingDataset(remote=b.url, local=local)
            assert b.url in str(live.value)
            assert a.url in str(live.value)
        finally:
            first.close()
        # A later process (the files stay): refused as well, naming the remote that filled it.
        code = f"from astream import StreamingDataset\nStreamingDataset(remote={b.url!r}, local={local!r})"
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120,
                              env={**os.environ, "PYTHONPATH": os.getcwd()})
        assert proc.returncode != 0
        assert "Reused local directory" in proc.stderr, proc.stderr
        # The same remote again is fine, and so is another split of the other remote.
        again = StreamingDataset(remote=a.url, local=local)
        try:
            assert sorted(_ids(again)) == list(range(N))
        finally:
            again.close()


def test_a_changed_local_copy_of_the_remote_is_served_as_its_index_says(tmp_path: Path, remotes: dict[str, Path]) -> None:
    """A same-size shard of other bytes in the cache (planted, or left by an older run) is
    checked by a new run with validate_hash (issue 32 finding 4): fetched again, never served."""
    local = tmp_path / "cache"
    with LoopbackServer(str(remotes["a"])) as a:
        ds = StreamingDataset(remote=a.url, local=str(local))
        _ids(ds)
        ds.close()
        victim = sorted(glob.glob(str(local / "shard.*")))[0]
        twin = remotes["b"] / os.path.basename(victim)
        assert os.path.getsize(twin) == os.path.getsize(victim)
        with open(twin, "rb") as src, open(victim, "wb") as dst:
            dst.write(src.read())  # same name, same size, the other remote's samples
        fresh = StreamingDataset(remote=a.url, local=str(local), validate_hash="xxh64")
        try:
            assert sorted(_ids(fresh)) == list(range(N))  # (before: b's samples from that shard)
            assert fresh.stats().hash_failures == 1
        finally:
            fresh.close()


def test_a_remote_rewritten_since_the_cache_was_filled_is_served_as_its_new_index_says(
    tmp_path: Path, remotes: dict[str, Path]
) -> None:
    """Same shard names and sizes, new samples (the remote's data was written again): the
    shards whose index entry changed are dropped from the cache when the new index comes,
    so their old bytes are never served under it, with or without validate_hash."""
    remote, local = tmp_path / "remote", str(tmp_path / "cache")
    _write(remote, 0, hashes=["xxh64"])
    with LoopbackServer(str(remote)) as server:
        first = StreamingDataset(remote=server.url, local=local)
        assert sorted(_ids(first)) == list(range(N))
        first.close()
        shutil.rmtree(remote)
        _write(remote, 50_000, hashes=["xxh64"])  # the same names and sizes, other samples
        second = StreamingDataset(remote=server.url, local=local)
        try:
            assert sorted(_ids(second)) == list(range(50_000, 50_000 + N))  # (before: the old samples)
        finally:
            second.close()


# -- issue 31 item 2: a cached shard that disappears ------------------------------------------------


def _remove_shards(local: Path) -> int:
    """Remove the installed shard files (as a cleaner would; files being written are left)."""
    gone = 0
    for path in glob.glob(str(local / "**" / "shard.*.mds"), recursive=True):
        with contextlib.suppress(FileNotFoundError):  # (evicted meanwhile)
            os.unlink(path)
            gone += 1
    return gone


@pytest.mark.filterwarnings("ignore::astream.errors.CacheWarning")  # (a small cache thrashes: that is the point)
@pytest.mark.parametrize("cache_limit", [None, "8kb"])
def test_a_deleted_shard_is_fetched_again_next_epoch_and_by_index(tmp_path: Path, splits: LoopbackServer,
                                                                 cache_limit: str | None) -> None:
    local = tmp_path / "cache"
    ds = StreamingDataset(remote=splits.url, local=str(local), split="train", shuffle=True, cache_limit=cache_limit)
    try:
        assert sorted(_ids(ds)) == list(range(N))
        assert _remove_shards(local) > 1
        assert int(ds[17]["id"]) == 17  # (before: ShardFormatError, cannot open the shard file)
        assert sorted(_ids(ds)) == list(range(N))
        assert _remove_shards(local) > 1
        assert [int(i) for i in ds.get_batch(np.arange(5, 40))["id"]] == list(range(5, 40))
    finally:
        ds.close()


@pytest.mark.filterwarnings("ignore::astream.errors.CacheWarning")
@pytest.mark.parametrize(("workers", "cache_limit"), [(0, None), (2, None), (2, "20kb")])
def test_shards_deleted_mid_epoch_are_fetched_again(tmp_path: Path, splits: LoopbackServer, workers: int,
                                                    cache_limit: str | None) -> None:
    local = tmp_path / "cache"
    ds = StreamingDataset(remote=splits.url, local=str(local), split="train", shuffle=True, batch_size=8,
                          cache_limit=cache_limit)
    try:
        for _ in range(2):
            seen = []
            for n, batch in enumerate(Loader(ds, num_workers=workers, worker_mode="thread"), start=1):
                assert (np.asarray(batch["x"])[:, 0] == np.asarray(batch["id"]) % 251).all()
                seen.extend(int(i) for i in batch["id"])
                if n in (2, 9):
                    _remove_shards(local)
            assert sorted(seen) == list(range(N))
    finally:
        ds.close()


# -- several ranks of a node, worker processes, cache_limit ------------------------------------------


def _launch(tmp: Path, spec: dict, ranks: int, run: str) -> list[dict]:
    procs, outs = [], []
    for rank in range(ranks):
        out = tmp / f"{run}-{rank}.json"
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": str(ranks), "LOCAL_RANK": str(rank),
               "LOCAL_WORLD_SIZE": str(ranks), "ASTREAM_RUN_ID": run,
               "PYTHONPATH": os.pathsep.join(p for p in (os.getcwd(), os.environ.get("PYTHONPATH")) if p)}
        procs.append(subprocess.Popen([sys.executable, str(RANK), "--spec", json.dumps(spec), "--out", str(out)],
                                      env=env, stderr=subprocess.PIPE, text=True))
        outs.append(out)
    errors = []
    try:
        for proc in procs:
            _, err = proc.communicate(timeout=280)
            errors.append(err if proc.returncode else None)
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.communicate()
    failed = [e for e in errors if e is not None]
    assert not failed, failed[0]
    return [json.loads(o.read_text()) for o in outs]


def _covers(ranks: list[dict], name: str, first: int) -> None:
    for epoch in range(len(ranks[0]["ids"][name])):
        seen = collections.Counter(i for r in ranks for i in r["ids"][name][epoch])
        assert set(seen) == set(range(first, first + N)), (name, epoch)


@pytest.mark.slow
@pytest.mark.parametrize("cache_limit", [None, "24kb"])
def test_two_ranks_with_workers_read_train_and_val_of_one_local(tmp_path: Path, splits: LoopbackServer,
                                                                 cache_limit: str | None) -> None:
    spec = {"local": str(tmp_path / "cache"), "workers": 2, "epochs": 2, "cache_limit": cache_limit,
            "datasets": [{"name": "train", "remote": splits.url, "split": "train"},
                         {"name": "val", "remote": splits.url, "split": "val"}],
            "delete": [1, 3]}  # and every shard removed mid-way through the second epoch
    ranks = _launch(tmp_path, spec, 2, f"tv-{cache_limit}")
    assert all(r["right"] for r in ranks)
    assert ranks[0]["removed"] > 0
    _covers(ranks, "train", 0)
    _covers(ranks, "val", VAL)


@pytest.mark.slow
def test_two_ranks_with_workers_refuse_a_second_remote(tmp_path: Path, remotes: dict[str, Path]) -> None:
    with LoopbackServer(str(remotes["a"])) as a, LoopbackServer(str(remotes["b"])) as b:
        spec = {"local": str(tmp_path / "cache"), "workers": 2, "cache_limit": "24kb",
                "datasets": [{"name": "a", "remote": a.url}], "delete": [0, 0]}
        ranks = _launch(tmp_path, spec, 2, "ab-1")
        assert all(r["right"] for r in ranks)
        _covers(ranks, "a", 0)
        spec["datasets"] = [{"name": "b", "remote": b.url}]
        with pytest.raises(AssertionError, match="Reused local directory"):
            _launch(tmp_path, spec, 2, "ab-2")
