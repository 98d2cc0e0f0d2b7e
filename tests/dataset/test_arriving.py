"""Samples served from a shard's file while it is still arriving, and checked once it has."""

from __future__ import annotations

import threading
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import astream._dataset.read.assembly as reader_module  # (where the reader assembles batches)
import astream._storage.sink as sink
from astream import MDSWriter
from astream._dataset.dataset import StreamingDataset
from astream._dataset.loader import Loader
from astream.errors import ServedSamplesError
from astream.testing import Fault, LoopbackServer

N = 6000
BATCH = 32


def _write(root: Path, compression: str | None) -> Path:
    # ~220 bytes a record, ~3 shards; compressible, so a zstd shard's output keeps pace with its input.
    with MDSWriter(out=str(root), columns={"id": "int64", "b": "bytes"}, size_limit="512kb",
                   compression=compression) as writer:
        for i in range(N):
            writer.write({"id": i, "b": bytes([i % 251]) * 200})
    return root


@pytest.fixture(scope="module", params=[None, "zstd"])
def remote(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _write(tmp_path_factory.mktemp(f"arriving-{request.param}"), request.param)


@pytest.fixture(autouse=True)
def small_flushes(monkeypatch: pytest.MonkeyPatch) -> None:
    # The cache writes what has arrived every 4 KB (not every MB): the stalled part is small.
    monkeypatch.setattr(sink, "FLUSH_BYTES", 4096)


def _check(batch: dict[str, Any]) -> list[int]:
    ids = batch["id"].tolist()
    assert list(batch["b"]) == [bytes([i % 251]) * 200 for i in ids]
    return ids


def _first_shard(remote: Path) -> tuple[str, str, int, int]:
    """(stored name, raw name, stored bytes, samples) of shard 0."""
    ds = StreamingDataset(local=str(remote), batch_size=BATCH)
    try:
        info = ds.indexes[0].shards[0]
        return info.stored.basename, info.raw_data.basename, info.stored.bytes, info.samples
    finally:
        ds.close()


@pytest.fixture
def gate() -> Iterator[threading.Event]:
    event = threading.Event()
    yield event
    event.set()  # never leave the server's response waiting


def test_samples_come_from_a_shard_still_arriving(remote: Path, tmp_path: Path, gate: threading.Event) -> None:
    stored, raw, size, samples = _first_shard(remote)
    cache = tmp_path / "cache"
    with LoopbackServer(str(remote)) as server:
        # The download of shard 0 stops after 60 % of its bytes until the gate opens.
        server.add(Fault("stall", match=stored, after=int(size * 0.6), ranged=False, gate=gate))
        ds = StreamingDataset(remote=server.url, local=str(cache), batch_size=BATCH)
        try:
            it = iter(Loader(ds, batch_size=BATCH))
            ids: list[int] = []
            # Raw: a third of the shard, past what a ranged read ahead serves (a quarter),
            # well within what has arrived. zstd: a fifth (the decoder hands out whole
            # 128 KB blocks; the first is there). Without reading the arriving file this
            # waits forever (the test's timeout).
            while len(ids) < samples // (3 if stored == raw else 5):
                ids += _check(next(it))
            assert not (cache / raw).exists()  # not installed: these came while it arrived
            assert any(p.name.startswith(raw + ".") and p.name.endswith(".tmp") for p in cache.iterdir())
            gate.set()
            for batch in it:
                ids += _check(batch)
            assert ids == list(range(N))
            assert (cache / raw).exists()
        finally:
            ds.close()
    assert not [p for p in cache.iterdir() if p.name.endswith(".tmp")]


def test_batches_of_an_arriving_shard_are_decoded_many_at_once(
    remote: Path, tmp_path: Path, gate: threading.Event, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A run of arrived records is decoded for many batches at once, as an installed shard's
    are (one small shard per batch cost ~5x a warm batch), and the batches stay exact."""
    stored, raw, size, samples = _first_shard(remote)
    cache = tmp_path / "cache"
    windows: list[int] = []  # positions of each window decoded while shard 0 was not installed
    real = reader_module.decode_ahead

    def spy(*args: Any, **kwargs: Any) -> Any:
        ahead = real(*args, **kwargs)
        if ahead is not None and not (cache / raw).exists():
            windows.append(ahead.stop - ahead.start)
        return ahead

    monkeypatch.setattr(reader_module, "decode_ahead", spy)
    with LoopbackServer(str(remote)) as server:
        server.add(Fault("stall", match=stored, after=int(size * 0.6), ranged=False, gate=gate))
        ds = StreamingDataset(remote=server.url, local=str(cache), batch_size=BATCH)
        try:
            it = iter(Loader(ds, batch_size=BATCH))
            ids: list[int] = []
            while len(ids) < samples // (3 if stored == raw else 5):
                ids += _check(next(it))
            assert not (cache / raw).exists()
            served_early = len(ids)
            gate.set()
            ids += [i for b in it for i in _check(b)]
        finally:
            ds.close()
    assert ids == list(range(N))
    # Without windows over arriving records every one of these batches is decoded alone.
    assert sum(windows) >= served_early // 2, (windows, served_early)
    assert max(windows) >= 4 * BATCH


def test_shuffled_epoch_while_arriving_equals_the_cached_one(remote: Path, tmp_path: Path) -> None:
    stored, _, size, _ = _first_shard(remote)
    kwargs: dict[str, Any] = {"shuffle": True, "shuffle_seed": 5, "batch_size": BATCH}
    warm = StreamingDataset(local=str(remote), **kwargs)
    try:
        expected = [i for b in Loader(warm, batch_size=BATCH) for i in _check(b)]
    finally:
        warm.close()
    with LoopbackServer(str(remote)) as server:
        # (A shuffled batch reads all over its shards: it waits for the stall to end.)
        server.add(Fault("stall", match=stored, after=int(size * 0.6), ranged=False, seconds=0.3))
        ds = StreamingDataset(remote=server.url, local=str(tmp_path / "cache"), **kwargs)
        try:
            ids = [i for b in Loader(ds, batch_size=BATCH) for i in _check(b)]
        finally:
            ds.close()
    assert ids == expected


def test_a_shard_that_changes_after_samples_were_served_fails_the_epoch(tmp_path: Path, gate: threading.Event) -> None:
    remote = _write(tmp_path / "remote", None)
    stored, _, size, samples = _first_shard(remote)
    # (A server without ranges: the cut transfer starts again from byte 0.)
    with LoopbackServer(str(remote), ranges=False) as server:
        # The download is cut at 60 %; meanwhile the remote's shard changes, so the
        # transfer that starts again brings other bytes.
        server.add(Fault("reset", match=stored, after=int(size * 0.6), ranged=False, gate=gate))
        ds = StreamingDataset(remote=server.url, local=str(tmp_path / "cache"), batch_size=BATCH)
        try:
            it = iter(Loader(ds, batch_size=BATCH))
            ids: list[int] = []
            while len(ids) < samples // 3:
                ids += _check(next(it))
            data = bytearray((remote / stored).read_bytes())
            data[-1] ^= 0xFF  # (the last record's last byte: only the header and the first records were served)
            head = int.from_bytes(data[4:8], "little")  # the first record's start
            data[head + 10] ^= 0xFF  # a byte of record 0, already handed out
            (remote / stored).write_bytes(bytes(data))
            gate.set()
            with pytest.raises(ServedSamplesError, match="differ from those its samples were served from"):
                list(it)
        finally:
            ds.close()


def test_validate_hash_streams_are_never_read_while_arriving(tmp_path: Path) -> None:
    remote = tmp_path / "remote"
    with MDSWriter(out=str(remote), columns={"id": "int64"}, hashes=["xxh64"]) as writer:
        for i in range(10):
            writer.write({"id": i})
    ds = StreamingDataset(remote=str(remote), local=str(tmp_path / "a"), validate_hash="xxh64")
    plain = StreamingDataset(remote=str(remote), local=str(tmp_path / "b"))
    try:
        assert not ds.session.sources.any_arriving
        policy = plain.session.sources
        paths = [policy.cache_path(g) for g in range(len(plain.sample_map.layouts)) if policy.arrives(g)]
        assert paths == [str(tmp_path / "b" / "shard.00000.mds")]
    finally:
        ds.close()
        plain.close()


def test_identical_bytes_pass_the_check(tmp_path: Path) -> None:
    """A transfer restarted from byte 0 with the same bytes: what was served is what landed."""
    remote = _write(tmp_path / "remote", None)
    stored, _, size, _ = _first_shard(remote)
    with LoopbackServer(str(remote), ranges=False) as server:
        server.add(Fault("reset", match=stored, after=int(size * 0.6), ranged=False))
        ds = StreamingDataset(remote=server.url, local=str(tmp_path / "cache"), batch_size=BATCH)
        try:
            ids = [i for b in Loader(ds, batch_size=BATCH) for i in _check(b)]
        finally:
            ds.close()
    assert ids == list(range(N))
    assert np.array_equal(np.sort(ids), np.arange(N))


def test_a_loader_worker_reads_a_shard_still_arriving(tmp_path: Path, gate: threading.Event) -> None:
    """The worker process reads the file the node agent (another process) is writing."""
    remote = tmp_path / "remote"
    with MDSWriter(out=str(remote), columns={"id": "int64", "b": "bytes"}, size_limit="8mb") as writer:
        for i in range(12_000):
            writer.write({"id": i, "b": bytes([i % 251]) * 1000})
    stored, raw, size, samples = _first_shard(remote)
    cache = tmp_path / "cache"
    with LoopbackServer(str(remote)) as server:
        # 6 of 8 MB arrive (the agent's sink writes what arrived every MB), then the gate holds.
        server.add(Fault("stall", match=stored, after=int(size * 0.75), ranged=False, gate=gate))
        ds = StreamingDataset(remote=server.url, local=str(cache), batch_size=BATCH)
        try:
            it = iter(Loader(ds, batch_size=BATCH, num_workers=1))
            ids: list[int] = []
            while len(ids) < samples // 2:
                batch = next(it)
                ids += batch["id"].tolist()
                assert list(batch["b"]) == [bytes([i % 251]) * 1000 for i in batch["id"].tolist()]
            assert not (cache / raw).exists()
            gate.set()
            ids += [i for b in it for i in b["id"].tolist()]
        finally:
            ds.close()
    assert ids == list(range(12_000))
