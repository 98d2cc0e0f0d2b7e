"""StreamingDataset and Loader behaviour: access, iteration flavours, state, bad input."""

from __future__ import annotations

import asyncio
import contextlib
import os
import pickle
import time
from pathlib import Path

import numpy as np
import pytest

from astream import MDSWriter
from astream._coord.world import World
from astream._dataset.dataset import StreamingDataset
from astream._dataset.loader import Loader
from astream._dataset.stream import Stream
from astream.errors import ConfigError, IndexFormatError, RemoteNotFoundError, StateError, UnsafeTypeError
from astream.testing import LoopbackServer

N = 300


@pytest.fixture(scope="module")
def remote(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("remote")
    with MDSWriter(out=str(root), columns={"id": "int64", "x": "ndarray:float32:3", "s": "str"},
                   compression="zstd", hashes=["xxh64"], size_limit="3kb") as writer:
        for i in range(N):
            writer.write({"id": i, "x": np.full(3, i, np.float32), "s": "é" * (i % 5)})
    return root


@pytest.fixture
def dataset(remote: Path, tmp_path: Path):
    ds = StreamingDataset(remote=str(remote), local=str(tmp_path / "cache"), shuffle=True, batch_size=8,
                          validate_hash="xxh64")
    yield ds
    ds.close()


def test_shape_and_random_access(dataset: StreamingDataset) -> None:
    assert dataset.size == N
    assert len(dataset) == N
    assert dataset.columns == {"id": "int64", "s": "str", "x": "ndarray:float32:3"}
    assert int(dataset[7]["id"]) == 7
    assert int(dataset[-1]["id"]) == N - 1
    batch = dataset.get_batch([3, 250, 4])
    assert batch["id"].tolist() == [3, 250, 4]
    assert batch["x"].shape == (3, 3)
    assert batch["s"] == ["é" * 3, "", "é" * 4]
    with pytest.raises(IndexError):
        dataset[N]


def test_epochs_advance_and_follow_the_plan(dataset: StreamingDataset) -> None:
    first = [int(s["id"]) for s in dataset]
    second = [int(s["id"]) for s in dataset]
    assert sorted(first) == sorted(second) == list(range(N))
    assert first != second
    for epoch, got in enumerate((first, second)):
        plan = dataset.plan(epoch=epoch, sample_in_epoch=0, workers_per_rank=1)
        assert got == plan.rank_order(0, 0).tolist()


@pytest.mark.parametrize(("workers", "mode"), [(0, "process"), (3, "thread"), (2, "process")])
def test_loader_batches_sync_and_async_agree(dataset: StreamingDataset, workers: int, mode: str) -> None:
    loader = Loader(dataset, num_workers=workers, worker_mode=mode, drop_last=False)
    sync_ids = [b["id"].tolist() for b in loader]
    assert len(sync_ids) == len(loader)

    async def collect() -> list[list[int]]:
        out = [b["id"].tolist() async for b in loader]
        await dataset.aclose()
        return out

    dataset.load_state_dict({**loader.state_dict(), "epoch": 0, "sample_in_epoch": 0})
    async_ids = asyncio.run(collect())
    assert async_ids == sync_ids
    flat = [i for b in sync_ids for i in b]
    assert sorted(flat) == list(range(N))
    plan = dataset.plan(epoch=0, sample_in_epoch=0, workers_per_rank=max(1, workers))
    assert flat == plan.rank_order(0, 0).tolist()


def test_custom_collate_gets_sample_lists(dataset: StreamingDataset) -> None:
    loader = Loader(dataset, collate_fn=lambda samples: [int(s["id"]) for s in samples])
    batches = list(loader)
    assert all(isinstance(b, list) for b in batches)
    assert sorted(i for b in batches for i in b) == list(range(N))


def test_state_resumes_without_repeats_on_the_same_object(dataset: StreamingDataset) -> None:
    loader = Loader(dataset, num_workers=0)
    seen: list[int] = []
    for n, batch in enumerate(loader, start=1):
        seen.extend(batch["id"].tolist())
        if n == 6:
            break
    state = loader.state_dict()
    assert state["sample_in_epoch"] == 48
    assert state["epoch"] == 0
    # MosaicML ignores a state loaded into a dataset that already iterated; astream resumes.
    loader.load_state_dict(state)
    rest = [i for b in loader for i in b["id"].tolist()]
    assert sorted(seen + rest) == list(range(N))


def test_dataset_pickles_without_resources(dataset: StreamingDataset) -> None:
    int(dataset[0]["id"])
    clone = pickle.loads(pickle.dumps(dataset))
    assert int(clone[5]["id"]) == 5
    clone.close()


def test_bad_states_are_refused_before_any_download(dataset: StreamingDataset, remote: Path, tmp_path: Path) -> None:
    good = Loader(dataset).state_dict()
    with pytest.raises(StateError, match="lacks"):
        dataset.load_state_dict({"epoch": 0})
    with pytest.raises(StateError, match="past the end"):
        dataset.load_state_dict({**good, "sample_in_epoch": N + 1})
    with pytest.raises(StateError, match="another dataset"):
        dataset.load_state_dict({**good, "astream_fingerprint": "0123456789abcdef"})
    with pytest.raises(StateError, match="non-negative int"):
        dataset.load_state_dict({**good, "epoch": -1})
    # orig partitioning needs the node count and the canonical nodes to divide one another.
    two_nodes = World(rank=0, world_size=2, local_rank=0, ranks_per_node=1)
    orig = StreamingDataset(remote=str(remote), local=str(tmp_path / "c2"), partition_algo="orig", batch_size=8,
                            world=two_nodes)
    with pytest.raises(StateError, match="current world"):
        orig.load_state_dict({**good, "num_canonical_nodes": 3, "initial_physical_nodes": 3})
    orig.close()


def test_bad_config_is_refused(remote: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="shuffle_algo"):
        StreamingDataset(remote=str(remote), local=str(tmp_path / "c"), shuffle_algo="py3")
    with pytest.raises(ConfigError, match="batch_size"):
        StreamingDataset(remote=str(remote), local=str(tmp_path / "c"), batch_size=0)
    with pytest.raises(ConfigError, match="remote=, local="):
        StreamingDataset()
    with pytest.raises(ConfigError, match="not both"):
        StreamingDataset(streams=[Stream(remote=str(remote))], remote=str(remote))
    with pytest.raises(ConfigError, match="proportion"):
        StreamingDataset(streams=[Stream(remote=str(remote), local=str(tmp_path / "a"), proportion=0.5),
                                  Stream(remote=str(remote), local=str(tmp_path / "b"), repeat=2)])
    with pytest.raises(ConfigError, match="batch_size"):
        Loader(StreamingDataset(remote=str(remote), local=str(tmp_path / "c")))


def test_missing_remote_and_corrupt_index(tmp_path: Path) -> None:
    empty = tmp_path / "empty"
    empty.mkdir()
    with LoopbackServer(str(empty)) as server, pytest.raises(RemoteNotFoundError, match=r"index\.json"):
        StreamingDataset(remote=server.url, local=str(tmp_path / "c"))
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "index.json").write_text('{"version": 2, "shards": [{"version": 2}]}')
    with pytest.raises(IndexFormatError, match="format"):
        StreamingDataset(local=str(bad))


def test_pickle_columns_need_opt_in(tmp_path: Path) -> None:
    with MDSWriter(out=str(tmp_path / "p"), columns={"obj": "pkl"}) as writer:
        writer.write({"obj": {"a": 1}})
    with pytest.raises(UnsafeTypeError, match="allow_unsafe_types"):
        StreamingDataset(local=str(tmp_path / "p"))
    ds = StreamingDataset(local=str(tmp_path / "p"), allow_unsafe_types=True)
    assert ds[0]["obj"] == {"a": 1}
    ds.close()


@pytest.mark.parametrize(("workers", "drop_last"), [(0, False), (2, True), (3, False)])
def test_batch_ids_match_iteration(dataset: StreamingDataset, workers: int, drop_last: bool) -> None:
    loader = Loader(dataset, num_workers=workers, worker_mode="thread", drop_last=drop_last)
    planned = [b.tolist() for b in loader.batch_ids(0)]
    assert len(planned) == len(loader)
    assert [b["id"].tolist() for b in loader] == planned
    # Resuming after 4 batches: the rest of the epoch, re-dealt over the workers.
    later = [i for b in loader.batch_ids(0, sample_in_epoch=8 * 4) for i in b.tolist()]
    first = [i for b in planned[:4] for i in b]
    assert not set(first) & set(later)
    if not drop_last:
        assert sorted(first + later) == list(range(N))


def test_loader_batch_size_must_match_the_plan(dataset: StreamingDataset) -> None:
    with pytest.raises(ConfigError, match="differs from the dataset's batch_size=8"):
        Loader(dataset, batch_size=7)


def test_get_batch_checks_indexes_at_once(dataset: StreamingDataset) -> None:
    batch = dataset.get_batch(np.array([-1, 0, 5]))
    assert batch["id"].tolist() == [N - 1, 0, 5]
    with pytest.raises(IndexError, match=f"sample {N} is out of range"):
        dataset.get_batch([1, N])
    with pytest.raises(ConfigError, match="integers"):
        dataset.get_batch(np.array([1.5]))
    assert dataset.get_batch([]) == {}


def test_remote_without_local_gets_a_cache_folder_per_remote(
    remote: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("ASTREAM_CACHE_DIR", str(tmp_path / "caches"))
    with LoopbackServer(str(remote)) as server:
        ds = StreamingDataset(remote=server.url)
        try:
            assert ds.streams[0].local_dir.startswith(str(tmp_path / "caches"))
            assert int(ds[3]["id"]) == 3
            assert (Path(ds.streams[0].local_dir) / "index.json").exists()
        finally:
            ds.close()
    assert Stream(remote="http://a/x").local_dir != Stream(remote="http://a/y").local_dir


def _forkserver_children() -> list[int]:
    """PIDs of the processes our forkserver started (the loader's worker processes)."""
    def children(pid: int) -> list[int]:
        found: list[int] = []
        for task in Path(f"/proc/{pid}/task").iterdir():
            with contextlib.suppress(OSError):
                found += [int(c) for c in (task / "children").read_text().split()]
        return found

    workers = []
    for child in children(os.getpid()):
        with contextlib.suppress(OSError):
            if b"forkserver" in Path(f"/proc/{child}/cmdline").read_bytes():
                workers += children(child)
    return workers


def test_closing_the_loader_stops_its_iterations_and_workers(tmp_path: Path) -> None:
    # Big enough that the workers are still busy (blocked on full queues) when it closes.
    samples = 20_000
    with MDSWriter(out=str(tmp_path / "ds"), columns={"id": "int64", "pad": "bytes"}) as writer:
        for i in range(samples):
            writer.write({"id": i, "pad": b"x" * 1000})
    dataset = StreamingDataset(local=str(tmp_path / "ds"), batch_size=8)
    try:
        with Loader(dataset, num_workers=2) as loader:
            batches = iter(loader)
            next(batches)
            deadline = time.monotonic() + 30
            while len(_forkserver_children()) < 2 and time.monotonic() < deadline:
                time.sleep(0.05)  # the worker processes boot while their stand-ins read
            assert len(_forkserver_children()) == 2
        assert _forkserver_children() == []
        assert list(batches) == []  # that iteration is over; the loader itself is not
        assert sorted(i for b in loader for i in b["id"].tolist()) == list(range(samples))
    finally:
        dataset.close()


def test_aclose_ends_an_async_iteration(dataset: StreamingDataset) -> None:
    async def run() -> list[int]:
        async with Loader(dataset, num_workers=1, worker_mode="thread") as loader:
            iteration = aiter(loader)
            first = await anext(iteration)
        with pytest.raises(StopAsyncIteration):
            await anext(iteration)
        await dataset.aclose()
        return first["id"].tolist()

    assert len(asyncio.run(run())) == 8


def test_async_for_left_with_break_closes_cleanly_under_asyncio_run(dataset: StreamingDataset) -> None:
    """`async for ...: break` then returning from asyncio.run: no generator finalized while running."""
    problems: list[dict] = []

    async def run() -> None:
        asyncio.get_running_loop().set_exception_handler(lambda loop, context: problems.append(context))
        async for _ in Loader(dataset):
            break
        await dataset.aclose()

    asyncio.run(run())
    assert problems == []


def test_sample_chunks_start_small_and_keep_the_order(dataset: StreamingDataset) -> None:
    """The sync bridge's chunks: the first sample alone (no wait for 63 more), then doubling."""
    async def run() -> list[list[int]]:
        async with dataset.open_epoch_reader(0, 0, worker=0, workers_per_rank=1, batch_size=8) as reader:
            out = [[int(s["id"]) for s in chunk] async for chunk in reader.chunks(chunk=16)]
        await dataset.aclose()
        return out

    chunks = asyncio.run(run())
    assert [len(c) for c in chunks] == [1, 2, 4, 8, *[16] * ((N - 15) // 16), (N - 15) % 16]
    plan = dataset.plan(epoch=0, sample_in_epoch=0, workers_per_rank=1, batch_size=8)
    assert [i for c in chunks for i in c] == plan.rank_order(0, 0).tolist()


@pytest.mark.parametrize("where", ["remote", "local"])
def test_validate_hash_the_index_lacks_is_refused_at_construction(remote: Path, tmp_path: Path, where: str) -> None:
    # The index has xxh64 digests only: sha1 is named with the file and what it has, before any
    # agent starts (it used to surface as "the node agent thread did not start: ...").
    kwargs = {"remote": str(remote), "local": str(tmp_path / "c")} if where == "remote" else {"local": str(remote)}
    with pytest.raises(ConfigError, match=r"validate_hash='sha1' but index.json has no sha1 digest .*it has: xxh64"):
        StreamingDataset(**kwargs, validate_hash="sha1")


@pytest.mark.parametrize("shuffle", [False, True])
def test_a_batch_across_streams_with_different_columns_is_refused(tmp_path: Path, shuffle: bool) -> None:
    # Collated by the first part's names, a column only one stream has was dropped without
    # a word, or the batch failed with a bare KeyError.
    for name, columns in (("a", {"x": "int"}), ("b", {"x": "int", "y": "int"})):
        with MDSWriter(out=str(tmp_path / name), columns=columns, size_limit=1 << 12) as writer:
            for i in range(203):  # 203 per stream: some batch spans both, shuffled or not
                writer.write(dict.fromkeys(columns, i))
    streams = [Stream(local=str(tmp_path / "a")), Stream(local=str(tmp_path / "b"))]
    ds = StreamingDataset(streams=streams, batch_size=8, shuffle=shuffle)
    with pytest.raises(ConfigError, match=r"different columns: \['x'\]; \['x', 'y'\]"):
        for _ in Loader(ds, batch_size=8):
            pass
    assert sorted(ds[0]) == ["x"]  # samples alone are fine
    assert sorted(ds[203]) == ["x", "y"]
    ds.close()
