"""A resume's first batch before the node agent answers (``astream._dataset.start.prelude``).

``Loader(); load_state_dict(); next()`` over a local folder of Parquet files: the first
batch is batch 0 of the iteration's reader, read from the row groups decoded at
``load_state_dict`` before the node is joined, while the node agent's start waits for that
decode; the reader checks it like every record it serves before an install. Every test compares the rows with pyarrow's own read of the same files, and the batches
after the first with an iteration that never took an early batch.
"""

from __future__ import annotations

import asyncio
import shutil
import threading
import time
from collections.abc import AsyncIterator, Awaitable, Callable, Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import parquet_data as data
import pytest

from astream import Loader, StreamingDataset
from astream._coord.agent import Agent
from astream._coord.config import CoordConfig
from astream._coord.world import World
from astream._dataset import tuning
from astream._dataset.handed import batch_length
from astream._dataset.start import prelude as prelude_module
from astream.cli import main as cli
from astream.errors import ServedSamplesError, StateError
from astream.testing import Fault, LoopbackServer, moto_s3

# Row group 2 of file 0 holds samples 2000-2399: a resume at 2100 reads it first.
AT = 2100
BATCH = 50


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[int, dict[str, Any]]]:
    root = tmp_path_factory.mktemp("parquet-early")
    return root, data.truth(data.write(root))


def _ids(batch: dict[str, Any], truth: dict[int, dict[str, Any]]) -> list[int]:
    out = []
    for row in data.rows(batch):
        assert data.same(row, truth[row["id"]]), row["id"]
        out.append(row["id"])
    return out


def _taken_early(monkeypatch: pytest.MonkeyPatch) -> list[int]:
    """Records the size of each first batch taken early (batch 0 of the reader, before the join)."""
    taken: list[int] = []
    real = prelude_module.Prelude.first_batch

    async def spy(self: prelude_module.Prelude, first: prelude_module.FirstAt, batches: AsyncIterator[Any],
                  join: Callable[[], Awaitable[tuple[int, int]]]) -> AsyncIterator[Any]:
        n = 0
        async for batch in real(self, first, batches, join):
            if not n:
                taken.append(batch_length(batch))
            n += 1
            yield batch

    monkeypatch.setattr(prelude_module.Prelude, "first_batch", spy)
    return taken


def _resumed(root: Path | str, cache: Path, state_at: int = AT, **kwargs: Any) -> tuple[StreamingDataset, Loader]:
    ds = StreamingDataset(remote=str(root), local=str(cache), format="parquet", batch_size=BATCH, **kwargs)
    loader = Loader(ds, drop_last=False)
    loader.load_state_dict({**loader.state_dict(), "sample_in_epoch": state_at})
    return ds, loader


def _rest(root: Path | str, cache: Path, truth: dict[int, dict[str, Any]], state_at: int = AT) -> list[int]:
    """Every row a loader resumed at ``state_at`` reads (checked against pyarrow's), in order."""
    ds, loader = _resumed(root, cache, state_at)
    try:
        return [i for batch in loader for i in _ids(batch, truth)]
    finally:
        loader.close()
        ds.close()


def _agents_held(monkeypatch: pytest.MonkeyPatch) -> tuple[threading.Event, threading.Event]:
    """Node agents (on this process's threads) start serving once the first event is set
    (30 s at most); the second is set when one does."""
    may_start, serving = threading.Event(), threading.Event()
    serve = Agent.serve

    async def held(self: Agent, *args: Any, **kwargs: Any) -> None:
        await asyncio.get_running_loop().run_in_executor(None, may_start.wait, 30)
        serving.set()
        await serve(self, *args, **kwargs)

    monkeypatch.setattr(Agent, "serve", held)
    return may_start, serving


def test_the_first_batch_comes_while_the_node_agent_cannot_start_exact(
        folder: tuple[Path, dict[int, dict[str, Any]]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The agent's start is held until the test has the first batch in hand: had the batch
    # needed the node, next() would wait for the agent (and the agent for the test).
    root, truth = folder
    taken = _taken_early(monkeypatch)
    may_start, serving = _agents_held(monkeypatch)
    ds, loader = _resumed(root, tmp_path / "cache")
    try:
        batches = iter(loader)
        first = next(batches)
        assert not serving.is_set()
        may_start.set()
        seen = _ids(first, truth) + [i for batch in batches for i in _ids(batch, truth)]
        assert serving.is_set()
        assert seen == sorted(truth)[AT:]
        assert taken == [BATCH]
        assert loader.state_dict()["sample_in_epoch"] == len(truth)
    finally:
        may_start.set()
        loader.close()
        ds.close()


def test_a_state_taken_after_the_early_batch_resumes_where_it_points(
        folder: tuple[Path, dict[int, dict[str, Any]]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The early batch counts like any other: a state taken right after it (before the
    # iteration joined the node) and one taken a batch later resume exactly there.
    root, truth = folder
    taken = _taken_early(monkeypatch)
    ds, loader = _resumed(root, tmp_path / "a")
    try:
        batches = iter(loader)
        first = _ids(next(batches), truth)
        after_one = loader.state_dict()
        second = _ids(next(batches), truth)
        after_two = loader.state_dict()
        batches.close()
    finally:
        loader.close()
        ds.close()
    assert first + second == sorted(truth)[AT : AT + 2 * BATCH]
    assert (after_one["sample_in_epoch"], after_two["sample_in_epoch"]) == (AT + BATCH, AT + 2 * BATCH)
    for state, cache in ((after_one, "b"), (after_two, "c")):
        again = StreamingDataset(remote=str(root), local=str(tmp_path / cache), format="parquet", batch_size=BATCH)
        try:
            resumed = Loader(again, drop_last=False)
            resumed.load_state_dict(state)
            rest = [i for batch in resumed for i in _ids(batch, truth)]
            resumed.close()
        finally:
            again.close()
        assert rest == sorted(truth)[state["sample_in_epoch"] :]
    assert taken == [BATCH] * 3


def test_a_first_batch_across_row_groups_and_files_is_one_batch_exact(
        folder: tuple[Path, dict[int, dict[str, Any]]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A resume 10 rows before the end of file 0: its first batch reads the last row group of
    # file 0 and the first of file 1, both decoded ahead, gathered in the reader's order.
    root, truth = folder
    taken = _taken_early(monkeypatch)
    ids = sorted(truth)
    at = sum(data.GROUPS) - 10
    assert _rest(root, tmp_path / "cache", truth, state_at=at) == ids[at:]
    assert taken == [BATCH]


def test_the_batch_transform_applies_to_the_early_batch(
        folder: tuple[Path, dict[int, dict[str, Any]]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    root, truth = folder
    taken = _taken_early(monkeypatch)
    ds = StreamingDataset(remote=str(root), local=str(tmp_path / "cache"), format="parquet", batch_size=BATCH)
    loader = Loader(ds, drop_last=False, batch_transform=_doubled_ids)
    try:
        loader.load_state_dict({**loader.state_dict(), "sample_in_epoch": AT})
        got = [int(i) for batch in loader for i in batch["twice"]]
    finally:
        loader.close()
        ds.close()
    assert got == [2 * i for i in sorted(truth)[AT:]]
    assert taken == [BATCH]


def _doubled_ids(batch: dict[str, Any]) -> dict[str, Any]:
    return {"twice": np.asarray(batch["id"]) * 2}


class _Tagged(StreamingDataset):
    """A subclass that transforms each sample (MosaicML's idiom): read sample by sample."""

    def __getitem__(self, index: int) -> Any:
        sample = super().__getitem__(index)
        return {"id": sample["id"], "tag": f"t{sample['id']}"}


def test_a_subclass_or_a_collate_fn_reads_the_first_batch_through_the_iteration(
        folder: tuple[Path, dict[int, dict[str, Any]]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Sample-by-sample reading (a subclass's __getitem__, a transform, a collate_fn) is the
    # iteration's: no early batch, and the first batch is transformed like the rest.
    root, truth = folder
    taken = _taken_early(monkeypatch)
    ds = _Tagged(remote=str(root), local=str(tmp_path / "a"), format="parquet", batch_size=BATCH)
    loader = Loader(ds, drop_last=False)
    try:
        loader.load_state_dict({**loader.state_dict(), "sample_in_epoch": AT})
        tags = [t for batch in loader for t in batch["tag"]]
    finally:
        loader.close()
        ds.close()
    assert tags == [f"t{i}" for i in sorted(truth)[AT:]]
    plain = StreamingDataset(remote=str(root), local=str(tmp_path / "b"), format="parquet", batch_size=BATCH)
    loader = Loader(plain, drop_last=False, collate_fn=lambda rows: [int(r["id"]) for r in rows])
    try:
        loader.load_state_dict({**loader.state_dict(), "sample_in_epoch": AT})
        assert [i for batch in loader for i in batch] == sorted(truth)[AT:]
    finally:
        loader.close()
        plain.close()
    assert taken == []


def test_the_node_agent_starts_after_the_first_batch_decode(
        folder: tuple[Path, dict[int, dict[str, Any]]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The warm start joins the node (starting its agent) only once the resume's row group is
    # decoded: on two cores the agent's start beside the decode slowed it down. A decode made
    # slow shows the order; the hold lasts hold_s at most (then the agent starts while the
    # decode waits for it).
    from astream._format.parquet import reader as parquet_reader

    root, truth = folder
    events: list[str] = []
    agent_started = threading.Event()
    init = parquet_reader.RowGroupReader.__init__

    def slow(self: Any, path: str, *args: Any, **kwargs: Any) -> None:
        if "read ahead of its install" in path:
            if tuning.READ_AHEAD.hold_s < 1:
                agent_started.wait(30)  # (the hold must end without the decode)
            else:
                time.sleep(0.3)
            events.append("decoded")
        init(self, path, *args, **kwargs)

    serve = Agent.serve

    async def noted(self: Agent, *args: Any, **kwargs: Any) -> None:
        events.append("agent")
        agent_started.set()
        await serve(self, *args, **kwargs)

    monkeypatch.setattr(parquet_reader.RowGroupReader, "__init__", slow)
    monkeypatch.setattr(Agent, "serve", noted)
    for hold, cache, want in ((tuning.READ_AHEAD.hold_s, "a", ["decoded", "agent"]), (0.05, "b", ["agent", "decoded"])):
        monkeypatch.setattr(tuning, "READ_AHEAD", replace(tuning.READ_AHEAD, hold_s=hold))
        events.clear()
        agent_started.clear()
        ds, loader = _resumed(root, tmp_path / cache)
        try:
            deadline = time.monotonic() + 30
            while len(events) < 2 and time.monotonic() < deadline:
                time.sleep(0.01)
            assert events == want, hold
            assert [i for batch in loader for i in _ids(batch, truth)] == sorted(truth)[AT:]
        finally:
            loader.close()
            ds.close()


def test_ranks_of_a_node_that_loaded_different_states_are_refused(
        folder: tuple[Path, dict[int, dict[str, Any]]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Two ranks of one node, one resuming epoch 0 and the other epoch 1 (a mistake): the
    # node begins one epoch, so one of them handed out a first batch of an epoch it does not
    # run: that rank's iteration is refused, naming the two epochs. (The node's agent starts
    # once both ranks have their first batch: neither row group is installed before its
    # rank's read-ahead looked, so both take theirs early.)
    root, truth = folder
    coord = CoordConfig(agent_mode="thread", agent_linger=0, connect_timeout=30)
    outcome: dict[int, BaseException | list[int]] = {}
    both_taken = threading.Barrier(2, timeout=60)
    may_start, _ = _agents_held(monkeypatch)
    taken = _taken_early(monkeypatch)

    def rank(r: int) -> None:
        world = World(rank=r, world_size=2, local_rank=r, ranks_per_node=2)
        ds = StreamingDataset(remote=str(root), local=str(tmp_path / "cache"), format="parquet",
                              batch_size=BATCH, world=world, coord=coord, run_id="early-states")
        try:
            loader = Loader(ds, drop_last=False)
            loader.load_state_dict({**loader.state_dict(), "epoch": r, "sample_in_epoch": AT})
            batches = iter(loader)
            seen = _ids(next(batches), truth)
            if both_taken.wait() == 0:
                may_start.set()
            outcome[r] = seen + [i for batch in batches for i in _ids(batch, truth)]
            loader.close()
        except BaseException as exc:
            outcome[r] = exc
        finally:
            ds.close()

    threads = [threading.Thread(target=rank, args=(r,)) for r in range(2)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
    finally:
        may_start.set()
    assert taken == [BATCH, BATCH]
    refused = [r for r, got in outcome.items() if isinstance(got, StateError)]
    assert len(outcome) == 2
    assert len(refused) == 1, outcome
    assert "loaded different states" in str(outcome[refused[0]])
    other = outcome[1 - refused[0]]
    assert isinstance(other, list)
    assert len(set(other)) == len(other)


def test_a_row_group_of_the_early_batch_alone_from_other_bytes_stops_the_epoch(
        folder: tuple[Path, dict[int, dict[str, Any]]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # The first batch takes its first 10 rows from row group 1 and
    # the rest from row group 2, which the later batches read. Row group 1 is read by the
    # early batch alone, and its bytes turn out not to be the installed ones: the epoch stops.
    import xxhash

    import astream._dataset.start.preopen as preopen_module

    root, truth = folder
    taken = _taken_early(monkeypatch)
    digests = [0]

    class FirstDiffers:
        @staticmethod
        def xxh3_64_intdigest(data: bytes) -> int:
            digests[0] += 1
            real = xxhash.xxh3_64_intdigest(data)
            return real + 1 if digests[0] == 1 else real  # (row group 1 is decoded first)

    monkeypatch.setattr(preopen_module, "xxhash", FirstDiffers)
    ds, loader = _resumed(root, tmp_path / "cache", state_at=1990)
    try:
        with pytest.raises(ServedSamplesError, match=r"rg00001.*served before it was installed"):
            _ = [_ids(batch, truth) for batch in loader]
    finally:
        loader.close()
        ds.close()
    assert taken == [BATCH]
    assert digests[0] == 2


def test_async_for_takes_the_early_batch_too(
        folder: tuple[Path, dict[int, dict[str, Any]]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # ``async for`` over a resumed loader: the same first batch, taken from the decoding on
    # the caller's loop; left after two batches, then resumed from its state, exact.
    root, truth = folder
    taken = _taken_early(monkeypatch)
    ds, loader = _resumed(root, tmp_path / "a")

    async def two() -> list[int]:
        seen: list[int] = []
        try:
            async for batch in loader:
                seen += _ids(batch, truth)
                if len(seen) == 2 * BATCH:
                    break
            return seen
        finally:
            await loader.aclose()
            await ds.aclose()  # (this loop's node client)

    try:
        seen = asyncio.run(two())
        state = loader.state_dict()
    finally:
        loader.close()
        ds.close()
    assert seen == sorted(truth)[AT : AT + 2 * BATCH]
    assert state["sample_in_epoch"] == AT + 2 * BATCH
    ds, loader = _resumed(root, tmp_path / "b", state_at=state["sample_in_epoch"])

    async def rest() -> list[int]:
        try:
            return [i async for batch in loader for i in _ids(batch, truth)]
        finally:
            await ds.aclose()

    try:
        assert asyncio.run(rest()) == sorted(truth)[AT + 2 * BATCH :]
    finally:
        loader.close()
        ds.close()
    assert taken == [BATCH, BATCH]


_TAKE_ONE_AND_LEAVE = """
import sys
from astream import Loader, StreamingDataset
ds = StreamingDataset(remote=sys.argv[1], local=sys.argv[2], format="parquet", batch_size=50)
loader = Loader(ds, drop_last=False)
loader.load_state_dict({**loader.state_dict(), "sample_in_epoch": 2100})
print(int(next(iter(loader))["id"][0]))
"""


def test_a_program_that_takes_the_first_batch_and_ends_says_nothing_more(
        folder: tuple[Path, dict[int, dict[str, Any]]], tmp_path: Path) -> None:
    # The iteration joins the node after the early batch: a program that ends right then
    # (it looked at one batch) ends while the agent starts; nothing is logged for that.
    import os
    import subprocess
    import sys

    root, _ = folder
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path(__file__).parents[2]), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run([sys.executable, "-c", _TAKE_ONE_AND_LEAVE, str(root), str(tmp_path / "cache")],
                          capture_output=True, text=True, timeout=60, env=env)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == [str(AT)]
    assert done.stderr == ""


@pytest.fixture(scope="module")
def served(folder: tuple[Path, dict[int, dict[str, Any]]],
           tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[LoopbackServer, Path]]:
    """The folder with its written index, behind a loopback HTTP server (it cannot list)."""
    root = tmp_path_factory.mktemp("parquet-served")
    for path in folder[0].glob("*.parquet"):
        shutil.copy(path, root / path.name)
    assert cli(["-q", "index", str(root)]) == 0
    with LoopbackServer(str(root)) as server:
        yield server, root


def _ranged(server: LoopbackServer, name: str) -> list[str]:
    return [r.range or "" for r in server.log if r.method == "GET" and r.path == name and r.range]


@pytest.mark.parametrize("budget", [None, 1])
def test_over_http_the_first_row_group_is_read_ahead_within_its_budget(
        folder: tuple[Path, dict[int, dict[str, Any]]], served: tuple[LoopbackServer, Path], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch, budget: int | None) -> None:
    # Over a network the resume's row group is fetched by range here too (its footer and its
    # column chunks, as the node's transfer fetches them: twice in all), up to its budget.
    _, truth = folder
    server, _ = served
    if budget is not None:
        monkeypatch.setattr(tuning, "READ_AHEAD", replace(tuning.READ_AHEAD, preopen_network_bytes=budget))
    taken = _taken_early(monkeypatch)
    server.clear()
    assert _rest(server.url, tmp_path / "cache", truth) == sorted(truth)[AT:]
    reads = _ranged(server, "part-00.parquet")
    chunks = [r for r in reads if reads.count(r) > 1]
    if budget is None:
        assert taken == [BATCH]
        assert len(chunks) >= 4  # the footer and the chunks of row group 2, twice
    else:
        assert taken == []
        assert not chunks  # every range once: the node's transfer alone


def test_over_http_a_failed_read_ahead_falls_back_to_the_nodes_transfer(
        folder: tuple[Path, dict[int, dict[str, Any]]], served: tuple[LoopbackServer, Path], tmp_path: Path,
        monkeypatch: pytest.MonkeyPatch) -> None:
    # The read ahead makes one attempt (a hint): a ranged read that fails leaves the first
    # batch to the iteration, whose transfer retries; no error, every row once.
    _, truth = folder
    server, _ = served
    taken = _taken_early(monkeypatch)
    server.clear()
    server.add(Fault("status", match="part-00.parquet", times=1, status=503, ranged=True))
    try:
        assert _rest(server.url, tmp_path / "cache", truth) == sorted(truth)[AT:]
    finally:
        server.clear()
    assert taken == []


def test_over_s3_the_first_batch_is_taken_early_exact(
        folder: tuple[Path, dict[int, dict[str, Any]]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("moto.server", reason="moto[server] is not installed")
    src, truth = folder
    taken = _taken_early(monkeypatch)
    with moto_s3("early-bucket") as client:
        for path in sorted(src.glob("*.parquet")):
            client.put_object(Bucket="early-bucket", Key=f"pq/{path.name}", Body=path.read_bytes())
        ds = StreamingDataset(remote="s3://early-bucket/pq", local=str(tmp_path / "cache"), format="parquet",
                              batch_size=BATCH)
        loader = Loader(ds, drop_last=False)
        try:
            loader.load_state_dict({**loader.state_dict(), "sample_in_epoch": AT})
            assert [i for batch in loader for i in _ids(batch, truth)] == sorted(truth)[AT:]
        finally:
            loader.close()
            ds.close()
    assert taken == [BATCH]


@pytest.mark.parametrize("how", ["workers", "cache_limit"])
def test_a_resume_with_workers_or_a_small_cache_reads_its_first_batch_through_the_iteration(
        folder: tuple[Path, dict[int, dict[str, Any]]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        how: str) -> None:
    # Loader workers read their own batches, and a bounded cache pins one batch at a time:
    # neither takes an early batch; each resumes exactly where the state points.
    root, truth = folder
    taken = _taken_early(monkeypatch)
    extra: dict[str, Any] = {"cache_limit": "2mb"} if how == "cache_limit" else {}
    ds = StreamingDataset(remote=str(root), local=str(tmp_path / "cache"), format="parquet", batch_size=BATCH,
                          **extra)
    loader = Loader(ds, drop_last=False, num_workers=2 if how == "workers" else 0,
                    worker_mode="thread" if how == "workers" else "process")
    try:
        loader.load_state_dict({**loader.state_dict(), "sample_in_epoch": AT})
        seen = [i for batch in loader for i in _ids(batch, truth)]
    finally:
        loader.close()
        ds.close()
    if how == "workers":
        assert sorted(seen) == sorted(truth)[AT:]  # (two workers' batches, merged round-robin)
    else:
        assert seen == sorted(truth)[AT:]
    assert taken == []
