"""The shard engine against real remotes on 127.0.0.1: download, reuse, validate, evict."""
# ruff: noqa: ASYNC230, ASYNC240, SIM117

from __future__ import annotations

import asyncio
import os
import shutil
import subprocess
from pathlib import Path

import pytest
from cachekit import raw_bytes, temporaries, tree

from astream._cache import ShardEngine, load_index
from astream._format.index import Index
from astream._storage import StorageOptions
from astream.errors import (
    CacheError,
    ConfigError,
    DownloadError,
    HashMismatchError,
    IndexFormatError,
    RemoteNotFoundError,
    UsageError,
)
from astream.testing import Fault, LoopbackServer, memory_bucket

Dataset = tuple[Path, Index]


async def test_cold_then_warm(server: LoopbackServer, dataset: Dataset, tmp_path: Path, options: StorageOptions) -> None:
    root, index = dataset
    local = tmp_path / "cache"
    assert (await load_index(str(local), server.url)).shards == index.shards
    async with ShardEngine(index, str(local), server.url, options=options, validate_hash="xxh64") as engine:
        paths = await asyncio.gather(*(engine.ensure(i) for i in range(4)))
        for i, path in enumerate(paths):
            assert Path(path).read_bytes() == raw_bytes(root, index, i)
            engine.unpin(i)
        stats = engine.stats
        assert (stats.misses, stats.hits, stats.shards_downloaded) == (4, 0, 4)
        assert stats.bytes_downloaded == sum(s.zip_data.bytes for s in index.shards if s.zip_data)
    assert tree(local) == ["index.json", *(f"shard.{i:05d}.mds" for i in range(4))]
    requests = len(server.log)
    async with ShardEngine(index, str(local), server.url, options=options) as engine:
        for i in range(4):
            async with engine.use(i) as path:
                assert Path(path).read_bytes() == raw_bytes(root, index, i)
        assert (engine.stats.hits, engine.stats.misses) == (4, 0)
    assert len(server.log) == requests  # no network request at all


async def test_keep_zip_and_reuse_of_a_local_zip(server: LoopbackServer, dataset: Dataset, tmp_path: Path, options: StorageOptions) -> None:
    root, index = dataset
    local = tmp_path / "cache"
    async with ShardEngine(index, str(local), server.url, options=options, keep_zip=True) as engine:
        async with engine.use(0):
            pass
    assert tree(local) == ["shard.00000.mds", "shard.00000.mds.zstd"]
    os.unlink(local / "shard.00000.mds")
    before = len(server.log)
    async with ShardEngine(index, str(local), server.url, options=options, validate_hash="sha1") as engine:
        async with engine.use(0) as path:
            assert Path(path).read_bytes() == raw_bytes(root, index, 0)
    assert len(server.log) == before  # decompressed from the kept zip, no download


async def test_corrupt_bytes_are_fetched_once_more(server: LoopbackServer, dataset: Dataset, tmp_path: Path, options: StorageOptions) -> None:
    root, index = dataset
    server.add(Fault("corrupt", match="shard.00001.mds.zstd"))
    async with ShardEngine(index, str(tmp_path / "c"), server.url, options=options, validate_hash="xxh64") as engine:
        async with engine.use(1) as path:
            assert Path(path).read_bytes() == raw_bytes(root, index, 1)
        assert engine.stats.hash_failures == 1
    assert server.count("shard.00001.mds.zstd") == 2


async def test_corrupt_twice_is_a_hash_mismatch_and_leaves_nothing(
    server: LoopbackServer, dataset: Dataset, tmp_path: Path, options: StorageOptions
) -> None:
    _, index = dataset
    server.add(Fault("corrupt", match="shard.00002.mds.zstd", times=None))
    local = tmp_path / "c"
    async with ShardEngine(index, str(local), server.url, options=options, validate_hash="sha1") as engine:
        with pytest.raises(HashMismatchError, match=r"shard\.00002\.mds\.zstd: sha1 digest is .* \(downloaded twice\)"):
            await engine.ensure(2)
        assert engine.stats.hash_failures == 2
    assert tree(local) == []


async def test_validate_hash_must_be_in_the_index(dataset: Dataset, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="no md5 digest"):
        ShardEngine(dataset[1], str(tmp_path), "http://127.0.0.1:9/", validate_hash="md5")


async def test_a_bad_existing_shard_is_replaced_when_validating(
    server: LoopbackServer, dataset: Dataset, tmp_path: Path, options: StorageOptions
) -> None:
    root, index = dataset
    local = tmp_path / "c"
    local.mkdir()
    good = raw_bytes(root, index, 0)
    (local / "shard.00000.mds").write_bytes(b"\0" * len(good))  # right size, wrong bytes
    async with ShardEngine(index, str(local), server.url, options=options, validate_hash="xxh64") as engine:
        async with engine.use(0) as path:
            assert Path(path).read_bytes() == good
        assert engine.stats.hash_failures == 1


async def test_stale_temporaries_of_dead_processes_are_removed(
    server: LoopbackServer, dataset: Dataset, tmp_path: Path, options: StorageOptions
) -> None:
    local = tmp_path / "c"
    local.mkdir()
    dead = subprocess.run(["true"], check=True)  # noqa: ASYNC221 - a pid that is surely gone
    del dead
    proc = subprocess.Popen(["true"])  # noqa: ASYNC220
    proc.wait()
    stale = local / f"shard.00000.mds.{proc.pid}.0badc0de.tmp"
    mine = local / f"shard.00001.mds.{os.getpid()}.0badc0de.tmp"
    stale.write_bytes(b"junk")
    mine.write_bytes(b"live")
    async with ShardEngine(dataset[1], str(local), server.url, options=options):
        pass
    assert not stale.exists()
    assert mine.exists()


async def test_cache_limit_too_small_is_a_construction_error(dataset: Dataset, tmp_path: Path) -> None:
    _, index = dataset
    largest = max(s.raw_data.bytes for s in index.shards)
    with pytest.raises(CacheError, match=r"cache_limit=.* is too small"):
        ShardEngine(index, str(tmp_path), "http://127.0.0.1:9/", cache_limit=largest)
    with pytest.raises(ConfigError, match="cache_limit"):
        ShardEngine(index, str(tmp_path), "http://127.0.0.1:9/", cache_limit="lots")
    ShardEngine(index, str(tmp_path), "http://127.0.0.1:9/", cache_limit=2 * largest)


async def test_lru_eviction_never_touches_pinned_shards(
    server: LoopbackServer, dataset: Dataset, tmp_path: Path, options: StorageOptions
) -> None:
    _, index = dataset
    size = index.shards[0].raw_data.bytes
    local = tmp_path / "c"
    async with ShardEngine(index, str(local), server.url, options=options, cache_limit=f"{2 * size + 10}b") as engine:
        await engine.ensure(0)  # stays pinned
        async with engine.use(1):
            pass
        async with engine.use(2):  # evicts 1, the only unpinned one
            pass
        assert engine.is_ready(0)
        assert not engine.is_ready(1)
        assert engine.stats.evictions == 1
        assert engine.stats.cache_bytes <= 2 * size + 10
        engine.unpin(0)  # releasing counts as a use: 2 is now the least recently used
        async with engine.use(3):
            pass
        assert engine.is_ready(0)
        assert not engine.is_ready(2)
    assert tree(local) == ["shard.00000.mds", "shard.00003.mds"]


async def test_local_only_shards_are_never_evicted(make_dataset: object, tmp_path: Path, options: StorageOptions) -> None:
    root, index = make_dataset(compression=None)  # type: ignore[operator]
    size = index.shards[0].raw_data.bytes
    async with ShardEngine(index, str(root), None, options=options, cache_limit=2 * size) as engine:
        for i in range(4):
            async with engine.use(i) as path:
                assert Path(path).parent == root
        assert engine.stats.evictions == 0
    assert len([p for p in tree(root) if p.endswith(".mds")]) == 4


async def test_local_only_compressed_dataset_is_decompressed_in_place(dataset: Dataset, options: StorageOptions) -> None:
    root, index = dataset
    async with ShardEngine(index, str(root), options=options) as engine:
        async with engine.use(3) as path:
            assert Path(path).read_bytes() == raw_bytes(root, index, 3)
    assert (root / "shard.00003.mds.zstd").exists()


async def test_a_local_directory_remote(dataset: Dataset, tmp_path: Path, options: StorageOptions) -> None:
    root, index = dataset
    async with ShardEngine(index, str(tmp_path / "c"), f"file://{root}", options=options) as engine:
        async with engine.use(1) as path:
            assert Path(path).read_bytes() == raw_bytes(root, index, 1)


async def test_a_memory_remote_with_a_split(dataset: Dataset, tmp_path: Path, options: StorageOptions) -> None:
    root, index = dataset
    bucket = memory_bucket("engine-test")
    for p in root.iterdir():
        bucket[f"ds/train/{p.name}"] = p.read_bytes()
    local = tmp_path / "c"
    assert (await load_index(str(local), "memory://engine-test/ds", "train")).shards == index.shards
    async with ShardEngine(index, str(local), "memory://engine-test/ds", "train", options=options) as engine:
        async with engine.use(2) as path:
            assert Path(path) == local / "train" / "shard.00002.mds"


async def test_missing_remote_shard(dataset: Dataset, tmp_path: Path, options: StorageOptions) -> None:
    root, index = dataset
    remote = tmp_path / "r2"
    shutil.copytree(root, remote)
    os.unlink(remote / "shard.00001.mds.zstd")
    local = tmp_path / "c"
    with LoopbackServer(str(remote)) as srv:
        async with ShardEngine(index, str(local), srv.url, options=options) as engine:
            with pytest.raises(RemoteNotFoundError, match=r"shard\.00001\.mds\.zstd: HTTP 404"):
                await engine.ensure(1)
            assert not engine.cache.entries[1].pins
    assert tree(local) == []


async def test_a_remote_that_changed_size(dataset: Dataset, tmp_path: Path, options: StorageOptions) -> None:
    root, index = dataset
    remote = tmp_path / "r2"
    shutil.copytree(root, remote)
    with open(remote / "shard.00000.mds.zstd", "ab") as fh:
        fh.write(b"more")
    with LoopbackServer(str(remote)) as srv:
        async with ShardEngine(index, str(tmp_path / "c"), srv.url, options=options) as engine:
            with pytest.raises(DownloadError, match="the dataset changed after its index was written"):
                await engine.ensure(0)
        assert srv.count("shard.00000.mds.zstd") == 1
    assert tree(tmp_path / "c") == []


async def test_missing_index(tmp_path: Path, options: StorageOptions) -> None:
    (tmp_path / "empty").mkdir()
    with LoopbackServer(str(tmp_path / "empty")) as srv:
        with pytest.raises(RemoteNotFoundError, match=r"index\.json"):
            await load_index(str(tmp_path / "c"), srv.url)
    assert temporaries(tmp_path / "c") == []
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "index.json").write_text("{")
    with pytest.raises(IndexFormatError):
        await load_index(str(tmp_path / "bad"))


async def test_disk_full(server: LoopbackServer, dataset: Dataset, tmp_path: Path, options: StorageOptions) -> None:
    _, index = dataset
    local = tmp_path / "tiny"
    local.mkdir()
    mounted = subprocess.run(  # noqa: ASYNC221 - setup
        ["mount", "-t", "tmpfs", "-o", "size=24k", "tmpfs", str(local)], capture_output=True, check=False
    ).returncode == 0
    if not mounted:
        pytest.skip("cannot mount a tmpfs here (not root); test_disk_full_patched covers it")
    try:
        async with ShardEngine(index, str(local), server.url, options=options) as engine:
            await engine.ensure(0)
            with pytest.raises(CacheError, match="disk full"):
                await engine.ensure(1)
        assert tree(local) == ["shard.00000.mds"]
    finally:
        subprocess.run(["umount", str(local)], check=False)  # noqa: ASYNC221


async def test_disk_full_patched(
    server: LoopbackServer, dataset: Dataset, tmp_path: Path, options: StorageOptions, monkeypatch: pytest.MonkeyPatch
) -> None:
    import astream._cache.install as install

    real = install.ShardSink._emit

    def full(self: install.ShardSink, data: bytes) -> None:
        if self._written + len(data) > 5000:
            raise OSError(28, "No space left on device")
        real(self, data)

    monkeypatch.setattr(install.ShardSink, "_emit", full)
    local = tmp_path / "c"
    async with ShardEngine(dataset[1], str(local), server.url, options=options) as engine:
        with pytest.raises(CacheError, match="disk full"):
            await engine.ensure(0)
    assert tree(local) == []


async def test_engine_must_be_started(dataset: Dataset, tmp_path: Path) -> None:
    engine = ShardEngine(dataset[1], str(tmp_path), "http://127.0.0.1:9/")
    with pytest.raises(UsageError, match="async with"):
        await engine.ensure(0)
    await engine.aclose()
    await engine.aclose()


async def test_unsynced_shards_from_before_a_reboot_are_checked(
    server: LoopbackServer, dataset: Dataset, tmp_path: Path, options: StorageOptions
) -> None:
    root, index = dataset
    local = tmp_path / "c"
    async with ShardEngine(index, str(local), server.url, options=options, fsync=False) as engine:
        for i in (0, 1):
            async with engine.use(i):
                pass
    good = (local / "shard.00000.mds").read_bytes()
    (local / "shard.00001.mds").write_bytes(b"\0" * len(good))  # what a power cut can leave
    for name in ("shard.00000.mds", "shard.00001.mds"):
        os.utime(local / name, (1_000_000, 1_000_000))  # written long before this boot
    before = server.count("*.zstd")
    async with ShardEngine(index, str(local), server.url, options=options, fsync=False) as engine:
        assert engine.cache.entries[0].suspect
        for i in (0, 1):
            async with engine.use(i) as path:
                assert Path(path).read_bytes() == raw_bytes(root, index, i)
        assert engine.stats.hash_failures == 1
    assert server.count("*.zstd") == before + 1  # only the damaged one came again
    async with ShardEngine(index, str(local), server.url, options=options) as engine:
        assert not engine.cache.entries[0].suspect  # fsynced caches trust what they find


async def test_engines_can_share_one_pool_and_keep_their_own_stats(
    server: LoopbackServer, dataset: Dataset, tmp_path: Path, options: StorageOptions
) -> None:
    from astream._storage import StoragePool

    _, index = dataset
    server.add(Fault("status", match="shard.00001.mds.zstd", status=500))
    async with StoragePool(options) as pool:
        async with ShardEngine(index, str(tmp_path / "a"), server.url, pool=pool) as a, \
                ShardEngine(index, str(tmp_path / "b"), server.url, pool=pool) as b:
            async with a.use(0), b.use(1):
                pass
            assert (a.stats.retries, b.stats.retries) == (0, 1)
            assert a.stats.bytes_downloaded == index.shards[0].zip_data.bytes  # type: ignore[union-attr]
        http = pool.get(server.url)
        assert not http._closed  # the engines did not close the shared pool


async def test_the_next_transfer_starts_once_the_first_shards_bytes_are_in(
    server: LoopbackServer, dataset: Dataset, tmp_path: Path, options: StorageOptions, monkeypatch: pytest.MonkeyPatch
) -> None:
    import astream._cache.install as install
    from astream._storage.http import HttpStorage

    _, index = dataset
    events: list[str] = []
    fetch, finish = HttpStorage.fetch_into, install.ShardSink._finish

    async def logged_fetch(self: HttpStorage, url: str, *args: object, **kwargs: object) -> None:
        events.append("fetch " + url.rsplit("/", 1)[1][:11])
        await fetch(self, url, *args, **kwargs)  # type: ignore[arg-type]
        events.append("fetched " + url.rsplit("/", 1)[1][:11])

    def logged_finish(self: install.ShardSink) -> None:
        finish(self)
        events.append("ready " + os.path.basename(self.raw_path)[:11])

    monkeypatch.setattr(HttpStorage, "fetch_into", logged_fetch)
    monkeypatch.setattr(install.ShardSink, "_finish", logged_finish)
    async with ShardEngine(index, str(tmp_path / "c"), server.url, options=options, initial_concurrency=1) as engine:
        await asyncio.gather(*(engine.reserve(i) for i in range(3)))
        for i in range(3):
            await engine.wait_ready(i)
            engine.unpin(i)
    # Slow start: one transfer at first; the next starts when its bytes are in, without
    # waiting for its rename (readers read the arriving file; the rename is behind them).
    assert events[:2] == ["fetch shard.00000", "fetched shard.00000"]
    assert events.index("fetch shard.00001") > events.index("fetched shard.00000")
    assert {e for e in events if e.startswith("ready")} == {f"ready shard.0000{i}" for i in range(3)}
