"""Records read from the remote by byte range while their shard is still downloading."""

from __future__ import annotations

import asyncio
import pickle
import shutil
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from astream import MDSWriter
from astream._dataset.dataset import StreamingDataset
from astream._dataset.loader import Loader
from astream.errors import ShardFormatError
from astream.testing import Fault, LoopbackServer

N = 240
COLUMNS = {"id": "int64", "x": "ndarray:float32:3", "s": "str", "b": "bytes"}


def _write(root: Path, **kwargs: Any) -> Path:
    with MDSWriter(out=str(root), columns=COLUMNS, size_limit="6kb", **kwargs) as writer:
        for i in range(N):
            writer.write({"id": i, "x": np.full(3, i, np.float32), "s": "é" * (i % 5), "b": bytes([i % 256]) * (i % 40)})
    return root


@pytest.fixture(scope="module")
def raw_remote(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _write(tmp_path_factory.mktemp("raw"))


@pytest.fixture
def slow_server(raw_remote: Path) -> Iterator[LoopbackServer]:
    """Whole-shard downloads wait 0.5 s before their headers; ranged reads are served at once."""
    with LoopbackServer(str(raw_remote)) as server:
        server.add(Fault("delay", match="shard.*", times=None, ranged=False, seconds=0.5))
        yield server


def _check(batch: dict[str, Any], ids: list[int]) -> None:
    assert batch["id"].tolist() == ids
    assert batch["x"].tolist() == [[float(i)] * 3 for i in ids]
    assert list(batch["s"]) == ["é" * (i % 5) for i in ids]
    assert list(batch["b"]) == [bytes([i % 256]) * (i % 40) for i in ids]


def _ranged(server: LoopbackServer, name: str) -> int:
    return sum(1 for r in server.log if r.path.endswith(name) and r.range is not None)


def test_first_batch_does_not_wait_for_its_shard(slow_server: LoopbackServer, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    ds = StreamingDataset(remote=slow_server.url, local=str(cache), batch_size=8)
    try:
        it = iter(Loader(ds, batch_size=8))
        first = next(it)
        _check(first, list(range(8)))
        # The download of the shard is still held back by the server: these came by range.
        assert not (cache / "shard.00000.mds").exists()
        assert _ranged(slow_server, "shard.00000.mds") >= 1
        ids = first["id"].tolist()
        for batch in it:
            _check(batch, batch["id"].tolist())
            ids += batch["id"].tolist()
        assert ids == list(range(N))
        assert (cache / "shard.00000.mds").exists()  # the download went on and landed
        # Next epoch: every shard is cached, nothing is read from the remote.
        before = len(slow_server.log)
        assert [int(i) for batch in Loader(ds, batch_size=8) for i in batch["id"]] == list(range(N))
        assert slow_server.log[before:] == []
    finally:
        ds.close()


def test_at_most_a_quarter_of_a_shard_is_read_ahead(slow_server: LoopbackServer, tmp_path: Path) -> None:
    ds = StreamingDataset(remote=slow_server.url, local=str(tmp_path / "cache"), batch_size=2)
    try:
        ids = [int(i) for batch in Loader(ds, batch_size=2) for i in batch["id"]]
        assert ids == list(range(N))
        size = ds.indexes[0].shards[0].raw_data.bytes
        spans = [tuple(map(int, r.range[6:].split("-"))) for r in slow_server.log
                 if r.path == "shard.00000.mds" and r.range is not None]
        head, records = spans[0], spans[1:]
        assert head[0] == 0
        assert len(records) >= 2
        # Read ahead until a quarter of the shard's bytes, then wait for the download.
        read = sum(b - a + 1 for a, b in records)
        assert read <= size / 4 + max(b - a + 1 for a, b in records)
        assert read + sum(b - a + 1 for a, b in spans[:1]) < size
    finally:
        ds.close()


@pytest.mark.parametrize("how", ["loader", "collate", "iter", "async"])
def test_shuffled_epoch_read_ahead_equals_the_cached_one(
    how: str, slow_server: LoopbackServer, raw_remote: Path, tmp_path: Path
) -> None:
    def ids_of(ds: StreamingDataset) -> list[int]:
        if how == "loader":
            return [int(i) for batch in Loader(ds, batch_size=8) for i in batch["id"]]
        if how == "collate":
            return [int(s["id"]) for batch in Loader(ds, batch_size=8, collate_fn=list) for s in batch]
        if how == "iter":
            return [int(s["id"]) for s in ds]

        async def run() -> list[int]:
            try:
                return [int(s["id"]) async for s in ds]
            finally:
                await ds.aclose()  # its node client belongs to this loop

        return asyncio.run(run())

    kwargs: dict[str, Any] = {"shuffle": True, "shuffle_seed": 3, "batch_size": 8}
    warm = StreamingDataset(local=str(raw_remote), **kwargs)
    cold = StreamingDataset(remote=slow_server.url, local=str(tmp_path / "cache"), **kwargs)
    try:
        expected = ids_of(warm)
        assert sorted(expected) == list(range(N))
        assert ids_of(cold) == expected
        assert any(r.range is not None for r in slow_server.log)
    finally:
        warm.close()
        cold.close()


@pytest.mark.parametrize("case", ["hash", "zstd", "no-ranges"])
def test_where_read_ahead_does_not_apply(case: str, tmp_path: Path) -> None:
    root = _write(tmp_path / "remote", **({"compression": "zstd"} if case == "zstd" else {}),
                  **({"hashes": ["xxh64"]} if case == "hash" else {}))
    with LoopbackServer(str(root), ranges=case != "no-ranges") as server:
        # Downloads held back, so that reading ahead would happen if it applied.
        server.add(Fault("delay", match="shard.*", times=None, ranged=False, seconds=0.3))
        ds = StreamingDataset(remote=server.url, local=str(tmp_path / "cache"), batch_size=8,
                              validate_hash="xxh64" if case == "hash" else None)
        try:
            ids = [int(i) for batch in Loader(ds, batch_size=8) for i in batch["id"]]
            assert ids == list(range(N))
            ranged = [r for r in server.log if r.range is not None]
            if case == "no-ranges":
                # Tried once per shard, answered with the whole file (200), then left alone.
                assert ranged
                assert len({r.path for r in ranged}) == len(ranged)
            else:
                assert ranged == []
        finally:
            ds.close()


def test_a_header_that_disagrees_with_the_index_is_left_to_the_download(raw_remote: Path, tmp_path: Path) -> None:
    root = tmp_path / "remote"
    shutil.copytree(raw_remote, root)
    shard = root / "shard.00000.mds"
    data = bytearray(shard.read_bytes())
    struct.pack_into("<I", data, 4, 0)  # the first record's offset: inside the header
    shard.write_bytes(bytes(data))
    with LoopbackServer(str(root)) as server:
        server.add(Fault("delay", match="shard.*", times=None, ranged=False, seconds=0.3))
        ds = StreamingDataset(remote=server.url, local=str(tmp_path / "cache"), batch_size=8)
        try:
            with pytest.raises(ShardFormatError, match=r"shard\.00000\.mds"):
                next(iter(Loader(ds, batch_size=8)))
            assert _ranged(server, "shard.00000.mds") == 1  # the offset table only
        finally:
            ds.close()


def test_a_local_directory_remote_is_read_in_place_by_worker_processes(raw_remote: Path, tmp_path: Path) -> None:
    ds = StreamingDataset(remote=str(raw_remote), local=str(tmp_path / "cache"), batch_size=8)
    try:
        batches = list(Loader(ds, batch_size=8, num_workers=2))
        ids = [int(i) for batch in batches for i in batch["id"]]
        assert sorted(ids) == list(range(N))
        for batch in batches:
            _check(batch, batch["id"].tolist())
    finally:
        ds.close()


def test_peek_urls_follow_the_rules(slow_server: LoopbackServer, tmp_path: Path) -> None:
    from astream._dataset.read.policy import SourcePolicy

    ds = StreamingDataset(remote=slow_server.url, local=str(tmp_path / "cache"), batch_size=8)
    try:
        sources = ds.session.sources
        assert sources.any_ranged
        assert (sources.ranged_url(0), sources.cache_path(0)) == (
            f"{slow_server.url}/shard.00000.mds", str(tmp_path / "cache" / "shard.00000.mds"))
        # A loader's worker process reads ahead from local-directory remotes only.
        assert not SourcePolicy(ds.sample_map, ds.streams, sources.transfers, network=False).any_ranged
        early = pickle.loads(pickle.dumps(ds)).session.early_sources()
        assert early is not None
        assert early.ranged is None
    finally:
        ds.close()


def test_reading_ahead_ends_with_the_first_batch_from_the_cache(raw_remote: Path, tmp_path: Path) -> None:
    with LoopbackServer(str(raw_remote)) as server:
        # Shard 0 arrives at once; the later ones are held back when the reader gets there.
        for name in ("shard.00001.mds", "shard.00002.mds"):
            server.add(Fault("delay", match=name, times=None, ranged=False, seconds=0.5))
        ds = StreamingDataset(remote=server.url, local=str(tmp_path / "cache"), batch_size=8)
        try:
            ids = [int(i) for batch in Loader(ds, batch_size=8) for i in batch["id"]]
            assert ids == list(range(N))
            # Past the start of the epoch the reader waits for downloads instead of fetching
            # the same bytes twice.
            assert _ranged(server, "shard.00001.mds") == 0
            assert _ranged(server, "shard.00002.mds") == 0
        finally:
            ds.close()


@pytest.fixture(scope="module")
def one_shard_remote(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("one")
    with MDSWriter(out=str(root), columns={"id": "int64", "b": "bytes"}, size_limit="4mb") as writer:
        for i in range(2000):
            writer.write({"id": i, "b": bytes([i % 256]) * 500})
    return root


@pytest.mark.parametrize("shuffle", [False, True])
def test_records_near_the_start_come_with_the_offset_table(shuffle: bool, one_shard_remote: Path, tmp_path: Path) -> None:
    with LoopbackServer(str(one_shard_remote)) as server:
        server.add(Fault("delay", match="shard.*", times=None, ranged=False, seconds=0.5))
        ds = StreamingDataset(remote=server.url, local=str(tmp_path / "cache"), batch_size=8, shuffle=shuffle)
        try:
            it = iter(Loader(ds, batch_size=8))
            first = next(it)
            assert list(first["b"]) == [bytes([i % 256]) * 500 for i in first["id"].tolist()]
            spans = [r.range for r in server.log if r.path == "shard.00000.mds" and r.range is not None]
            table = 4 + 4 * (2000 + 1)
            if shuffle:
                # The records are spread over the shard: the table alone, then the records.
                assert spans[0] == f"bytes=0-{table - 1}"
                assert len(spans) >= 2
            else:
                # The first records lie behind the table: one request brings both.
                assert len(spans) == 1
                assert spans[0].startswith("bytes=0-")
                assert int(spans[0].split("-")[1]) > table + 8 * 500
            ids = first["id"].tolist() + [int(i) for batch in it for i in batch["id"]]
            assert sorted(ids) == list(range(2000))
        finally:
            ds.close()


def test_s3_remote_is_read_ahead_too(raw_remote: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """botocore's path-style GETs against the loopback server, as an S3-compatible store."""
    pytest.importorskip("aiobotocore", reason="s3:// needs the s3 extra")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "x")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "x")
    shutil.copytree(raw_remote, tmp_path / "s3root" / "bkt" / "ds")
    cache = tmp_path / "cache"
    with LoopbackServer(str(tmp_path / "s3root")) as server:
        monkeypatch.setenv("S3_ENDPOINT_URL", server.url)
        server.add(Fault("delay", match="bkt/ds/shard.*", times=None, ranged=False, seconds=0.5))
        ds = StreamingDataset(remote="s3://bkt/ds", local=str(cache), batch_size=8)
        try:
            it = iter(Loader(ds, batch_size=8))
            first = next(it)
            _check(first, list(range(8)))
            assert not (cache / "shard.00000.mds").exists()
            assert _ranged(server, "bkt/ds/shard.00000.mds") >= 1
            ids = first["id"].tolist() + [int(i) for batch in it for i in batch["id"]]
            assert ids == list(range(N))
        finally:
            ds.close()
