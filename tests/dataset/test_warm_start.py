"""A new loader fetches its first batches before it is iterated (issue #21, item 3).

Making a ``Loader`` joins the node in the background and prefetches the shards of the
first batch of each of its readers; a state loaded before the first iteration moves that
to the resume point (withdrawing the transfer under way), and a dataset closed or
collected unread stops it and leaves no agent running. A dataset alone (random access)
fetches nothing until it is read. A loopback HTTP server shows which shards were asked for.
"""

from __future__ import annotations

import asyncio
import gc
import json
import pickle
import threading
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path

import pytest

from astream import Loader, MDSWriter, StreamingDataset
from astream._coord.client import AsyncNodeClient
from astream._coord.config import CoordConfig
from astream.testing import Fault, LoopbackServer

N = 200
BATCH = 10
# The agent on a thread of the test, gone as soon as its last client leaves.
QUICK = CoordConfig(agent_mode="thread", agent_linger=0, connect_timeout=20)


@pytest.fixture(scope="module")
def root(tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("warm")
    with MDSWriter(out=str(out), columns={"id": "int64", "x": "bytes"}, size_limit="20kb") as w:
        for i in range(N):
            w.write({"id": i, "x": bytes([i % 251]) * 900})
    return out


@pytest.fixture
def server(root: Path) -> Iterator[LoopbackServer]:
    with LoopbackServer(str(root)) as s:
        yield s


def _names(root: Path) -> list[str]:
    return [s["raw_data"]["basename"] for s in json.loads((root / "index.json").read_text())["shards"]]


def _fetched(server: LoopbackServer) -> list[str]:
    """Shard files the server was asked for whole (the cache's transfers), in order."""
    return [r.path for r in server.log if r.method == "GET" and r.range is None and r.path.startswith("shard.")]


def _until(condition: Callable[[], bool], what: str) -> None:
    """Wait for something another thread does (a generous deadline: no timing is measured)."""
    done = threading.Event()
    for _ in range(2000):
        if condition():
            return
        done.wait(0.01)
    raise AssertionError(f"never happened: {what}")


def _agents() -> list[threading.Thread]:
    return [t for t in threading.enumerate() if t.name == "astream-agent"]


def _dataset(server: LoopbackServer, tmp_path: Path, run_id: str, **kwargs: object) -> StreamingDataset:
    return StreamingDataset(remote=server.url, local=str(tmp_path / "c"), batch_size=BATCH, coord=QUICK,
                            run_id=run_id, **kwargs)  # type: ignore[arg-type]


def test_a_new_loader_fetches_the_first_batch(root: Path, server: LoopbackServer, tmp_path: Path) -> None:
    names = _names(root)
    ds = _dataset(server, tmp_path, "warm-first")
    assert int(ds[BATCH * 9]["id"]) == BATCH * 9  # random access: its own shard only
    other = ds.sample_map.locate_one(BATCH * 9)[0]
    assert _fetched(server) == [names[other]]
    loader = Loader(ds)
    _until(lambda: _fetched(server) == [names[other], names[0]], "the first shard's transfer, without iterating")
    _until((tmp_path / "c" / names[0]).exists, "the first shard installed, before any iteration")
    assert [int(i) for b in loader for i in b["id"]] == list(range(N))
    assert _fetched(server).count(names[0]) == 1  # the iteration found it: one transfer
    ds.close()


def test_each_worker_s_first_batch(root: Path, server: LoopbackServer, tmp_path: Path) -> None:
    names = _names(root)
    ds = _dataset(server, tmp_path, "warm-workers")
    loader = Loader(ds, num_workers=3, worker_mode="thread")
    firsts = {int(s) for b in loader.batch_ids(0)[:3] for s in ds.sample_map.locate(b)[0]}  # a batch per worker
    assert len(firsts) > 1  # (the workers' first batches lie in several shards here)
    _until(lambda: set(_fetched(server)) == {names[s] for s in firsts}, "every worker's first shard")
    assert sorted(int(i) for b in loader for i in b["id"]) == list(range(N))
    ds.close()


def test_a_loaded_state_redirects_it(root: Path, server: LoopbackServer, tmp_path: Path) -> None:
    names = _names(root)
    gate = threading.Event()
    server.add(Fault("stall", match=names[0], ranged=False, gate=gate))  # the epoch's first shard hangs
    ds = _dataset(server, tmp_path, "warm-resume")
    try:
        loader = Loader(ds)
        _until(lambda: _fetched(server) == names[:1], "the first shard's transfer")
        at = 150
        loader.load_state_dict({"epoch": 0, "sample_in_epoch": at, "num_canonical_nodes": 1,
                                "shuffle_seed": 9176, "initial_physical_nodes": 1})
        resume_shard = ds.sample_map.locate_one(at)[0]
        _until(lambda: names[resume_shard] in _fetched(server), "the resume point's shard, without iterating")
        # The hanging transfer was withdrawn: nothing else waits for it.
        _until(lambda: _withdrawn(ds) >= 1, "the first shard's transfer withdrawn")
        assert [int(i) for b in loader for i in b["id"]] == list(range(at, N))
        assert names[0] not in _fetched(server)[1:]  # nothing came back for the start of the epoch
    finally:
        gate.set()
        ds.close()


def _withdrawn(ds: StreamingDataset) -> int:
    return _agent_count(ds, "withdrawn")


def _agent_count(ds: StreamingDataset, name: str) -> int:
    async def ask() -> int:
        async with ds.session.new_client(7, 8, role="worker") as client:  # a bystander's view of the node
            return int((await client.stats()).get(name, 0))

    return asyncio.run(ask())


def test_a_state_loaded_right_before_iterating_is_prefetched(root: Path, server: LoopbackServer,
                                                               tmp_path: Path) -> None:
    # Loader(), load_state_dict(), then iterating at once (a resume): the iteration begins
    # before the warm start has joined the node, and the resume point's prefetch still goes
    # (its keys are known; it overlaps the iteration's barrier and set-up). The start of
    # the epoch is never asked for.
    names = _names(root)
    ds = _dataset(server, tmp_path, "warm-resume-at-once")
    try:
        loader = Loader(ds)
        at = 150
        loader.load_state_dict({"epoch": 0, "sample_in_epoch": at, "num_canonical_nodes": 1,
                                "shuffle_seed": 9176, "initial_physical_nodes": 1})
        assert [int(i) for b in loader for i in b["id"]] == list(range(at, N))
        _until(lambda: _agent_count(ds, "op_prefetch") >= 1, "the resume point's prefetch")
        assert names[0] not in _fetched(server)
    finally:
        ds.close()


def test_the_iteration_asks_for_a_loaded_state_s_shard_before_its_reader_does(
        root: Path, server: LoopbackServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Its client joins before the warm start's (it connects while the agent starts), and
    # the barrier and the reader's set-up come before the reader's request: the resume
    # point's shard is asked for on it as soon as it joined, so the transfer overlaps them.
    calls: list[tuple[str, str, tuple[str, ...]]] = []
    prefetch, ensure_many = AsyncNodeClient.prefetch, AsyncNodeClient.ensure_many

    async def spy_prefetch(self: AsyncNodeClient, keys: Sequence[str], *, first: bool = False) -> None:
        calls.append((self.member, "prefetch", tuple(keys)))
        await prefetch(self, keys, first=first)

    async def spy_ensure(self: AsyncNodeClient, keys: Sequence[str], *, pin: bool = False,
                         first: bool = False) -> list[str]:
        calls.append((self.member, "ensure", tuple(keys)))
        return await ensure_many(self, keys, pin=pin, first=first)

    monkeypatch.setattr(AsyncNodeClient, "prefetch", spy_prefetch)
    monkeypatch.setattr(AsyncNodeClient, "ensure_many", spy_ensure)
    ds = _dataset(server, tmp_path, "warm-hand-over")
    try:
        loader = Loader(ds)
        at = 150
        loader.load_state_dict({"epoch": 0, "sample_in_epoch": at, "num_canonical_nodes": 1,
                                "shuffle_seed": 9176, "initial_physical_nodes": 1})
        assert [int(i) for b in loader for i in b["id"]] == list(range(at, N))
    finally:
        ds.close()
    key = f"0/{ds.sample_map.locate_one(at)[0]}"
    mine = [(op, keys) for member, op, keys in calls if member == "rank0.main"]
    assert mine[0][0] == "prefetch"  # before any request of its reader
    assert key in mine[0][1]


@pytest.mark.parametrize("how", ["close", "collect"])
def test_an_unread_dataset_stops_it(root: Path, server: LoopbackServer, tmp_path: Path, how: str) -> None:
    names = _names(root)
    gate = threading.Event()
    server.add(Fault("stall", match=names[0], ranged=False, gate=gate))
    before = set(_agents())  # (other tests' agents may still be lingering)
    ds = _dataset(server, tmp_path, f"warm-{how}")
    Loader(ds)  # made, never iterated
    try:
        _until(lambda: _fetched(server) == names[:1], "the first shard's transfer")
        ours = set(_agents()) - before
        assert ours
        if how == "close":
            ds.close()
        else:
            del ds
            gc.collect()
        # Its client left: the agent withdrew the transfer and, with nobody left, ended.
        _until(lambda: not any(t.is_alive() for t in ours), "the node agent's end")
    finally:
        gate.set()
    assert not list((tmp_path / "c").glob("shard.*"))  # no shard, no temporary left


def test_copies_have_none(root: Path, server: LoopbackServer, tmp_path: Path) -> None:
    ds = _dataset(server, tmp_path, "warm-copy")
    Loader(ds)
    assert ds._prelude is not None
    clone = pickle.loads(pickle.dumps(ds))  # what a loader's worker process gets
    assert clone._prelude is None
    assert int(clone[3]["id"]) == 3
    clone.close()
    ds.close()


def test_nothing_to_download_or_a_bounded_cache_has_none(root: Path, server: LoopbackServer, tmp_path: Path) -> None:
    local = StreamingDataset(local=str(root), batch_size=BATCH)
    bounded = StreamingDataset(remote=server.url, local=str(tmp_path / "c"), batch_size=BATCH, cache_limit="1mb")
    Loader(local)
    Loader(bounded)
    assert local._prelude is None
    assert bounded._prelude is None
    assert not _fetched(server)
    local.close()
    bounded.close()
