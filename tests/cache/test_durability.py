"""fsync=True hands shards over before their fsync; a marker covers the window (power-cut safety)."""
# ruff: noqa: ASYNC221, ASYNC240, ASYNC251, SIM117

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from cachekit import raw_bytes, tree

import astream._cache.cache as cache_mod
from astream._cache import ShardEngine
from astream._cache.durability import MARKER_PREFIX, BackgroundSync
from astream._format.index import Index
from astream._storage import StorageOptions
from astream.testing import LoopbackServer

Dataset = tuple[Path, Index]


def markers(root: Path) -> list[str]:
    return sorted(p.name for p in root.glob(MARKER_PREFIX + "*"))


async def test_a_shard_is_handed_over_before_its_fsync_and_the_marker_stays_until_then(
    server: LoopbackServer, dataset: Dataset, tmp_path: Path, options: StorageOptions, monkeypatch: pytest.MonkeyPatch
) -> None:
    root, index = dataset
    local = tmp_path / "c"
    gate = threading.Event()
    synced: list[str] = []
    real = BackgroundSync._sync_file

    def slow_sync(path: str) -> None:
        assert gate.wait(10)
        real(path)
        synced.append(os.path.basename(path))

    monkeypatch.setattr(BackgroundSync, "_sync_file", staticmethod(slow_sync))
    engine = ShardEngine(index, str(local), options=options, remote=server.url)
    async with engine:
        path = await engine.ensure(0)  # returns although no fsync has finished
        assert Path(path).read_bytes() == raw_bytes(root, index, 0)
        assert synced == []
        assert len(markers(local)) == 1  # durable before the rename, still there
        engine.unpin(0)
        gate.set()
    assert synced == ["shard.00000.mds"]
    assert markers(local) == []  # everything synced: the marker is gone
    assert tree(local) == ["shard.00000.mds"]


async def test_fsync_false_makes_no_marker(server: LoopbackServer, dataset: Dataset, tmp_path: Path, options: StorageOptions) -> None:
    _, index = dataset
    local = tmp_path / "c"
    async with ShardEngine(index, str(local), server.url, options=options, fsync=False) as engine:
        async with engine.use(0):
            assert markers(local) == []


async def test_a_failed_fsync_keeps_the_marker(
    server: LoopbackServer, dataset: Dataset, tmp_path: Path, options: StorageOptions, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, index = dataset
    local = tmp_path / "c"

    def broken(path: str) -> None:
        raise OSError(5, "Input/output error")

    monkeypatch.setattr(BackgroundSync, "_sync_file", staticmethod(broken))
    engine = ShardEngine(index, str(local), server.url, options=options)
    await engine.start()
    async with engine.use(0):
        pass
    with pytest.warns(RuntimeWarning, match="fsync"):
        await engine.aclose()
    assert len(markers(local)) == 1  # a run after a power cut will check shard 0


async def test_after_a_power_cut_shards_renamed_since_the_marker_are_checked(
    server: LoopbackServer, dataset: Dataset, tmp_path: Path, options: StorageOptions, monkeypatch: pytest.MonkeyPatch
) -> None:
    root, index = dataset
    local = tmp_path / "c"
    async with ShardEngine(index, str(local), server.url, options=options) as engine:
        for i in (0, 1):
            async with engine.use(i):
                pass
    # What a power cut can leave: the marker of a run that had renamed shard 1 (torn: its
    # data never reached the disk) but not shard 0, which an earlier run had synced.
    good0 = (local / "shard.00000.mds").read_bytes()
    time.sleep(0.05)
    marker = local / f"{MARKER_PREFIX}99999999.0badc0de"
    marker.touch()
    time.sleep(0.05)
    size1 = len((local / "shard.00001.mds").read_bytes())
    (local / "shard.00001.mds").write_bytes(b"\0" * size1)
    monkeypatch.setattr(cache_mod, "CTIME_SLACK", 0.0)
    booted = os.stat(marker).st_ctime + 0.01
    monkeypatch.setattr(cache_mod, "boot_time", lambda: booted)  # the machine rebooted since
    before = server.count("*.zstd")
    async with ShardEngine(index, str(local), server.url, options=options) as engine:
        assert [e.suspect for e in engine.cache.entries[:2]] == [False, True]
        assert [m.path for m in engine.cache.stale_markers] == [str(marker)]
        async with engine.use(1) as path:
            assert Path(path).read_bytes() == raw_bytes(root, index, 1)
        assert engine.stats.hash_failures == 1
    assert server.count("*.zstd") == before + 1  # the torn one came again
    assert (local / "shard.00000.mds").read_bytes() == good0
    assert markers(local) == []  # every shard it covered is resolved: the old marker is gone


async def test_a_stale_marker_stays_while_a_shard_it_covers_is_unchecked(
    server: LoopbackServer, dataset: Dataset, tmp_path: Path, options: StorageOptions, monkeypatch: pytest.MonkeyPatch
) -> None:
    _, index = dataset
    local = tmp_path / "c"
    async with ShardEngine(index, str(local), server.url, options=options, fsync=False) as engine:
        for i in (0, 1):
            async with engine.use(i):
                pass
    marker = local / f"{MARKER_PREFIX}99999999.0badc0de"
    marker.touch()
    monkeypatch.setattr(cache_mod, "CTIME_SLACK", 3600.0)  # the shards count as renamed after it
    monkeypatch.setattr(cache_mod, "boot_time", lambda: time.time() + 1)
    for fsync in (True, False):  # whatever the run's own setting
        async with ShardEngine(index, str(local), server.url, options=options, fsync=fsync) as engine:
            assert [e.suspect for e in engine.cache.entries[:2]] == [True, True]
            async with engine.use(0):
                pass
        assert marker.name in markers(local)  # shard 1 was never checked
    async with ShardEngine(index, str(local), server.url, options=options) as engine:
        for i in (0, 1):
            async with engine.use(i):
                pass
    assert markers(local) == []


async def test_a_marker_of_this_boot_is_trusted_and_adopted(
    server: LoopbackServer, dataset: Dataset, tmp_path: Path, options: StorageOptions
) -> None:
    root, index = dataset
    local = tmp_path / "c"
    async with ShardEngine(index, str(local), server.url, options=options, fsync=False) as engine:
        async with engine.use(0):
            pass
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True,
                          check=True)
    (local / f"{MARKER_PREFIX}{int(dead.stdout)}.0badc0de").touch()  # a crashed run of this boot
    live = local / f"{MARKER_PREFIX}{os.getppid()}.0badc0de"  # a run still going
    live.touch()
    async with ShardEngine(index, str(local), server.url, options=options) as engine:
        assert not engine.cache.entries[0].suspect  # no power cut since: complete
        async with engine.use(0) as path:
            assert Path(path).read_bytes() == raw_bytes(root, index, 0)
    assert markers(local) == [live.name]  # the crashed run's marker was adopted, the live one left


async def test_no_marker_no_rename(
    server: LoopbackServer, dataset: Dataset, tmp_path: Path, options: StorageOptions, monkeypatch: pytest.MonkeyPatch
) -> None:
    from astream.errors import CacheError

    _, index = dataset
    local = tmp_path / "c"

    def refused(self: BackgroundSync) -> None:
        raise PermissionError(13, "Permission denied")

    monkeypatch.setattr(BackgroundSync, "_make_marker", refused)
    async with ShardEngine(index, str(local), server.url, options=options) as engine:
        with pytest.raises(CacheError, match="Permission denied"):
            await engine.ensure(0)
    assert tree(local) == []  # the shard was never renamed into place without its marker
