# ruff: noqa: ASYNC230, ASYNC240
"""What the node agent may hand out as it is (issue 32 finding 4, issue 31 item 2).

The agent's lookup (``CacheProvider.lookup`` -> :meth:`ShardEngine.servable`) answers a
shard's path without a fetch only when the shard is ready, needs no check (found by a
new run with ``validate_hash``, or suspect after a power cut) and its files are on disk
with the sizes the index gives; otherwise the ensure that follows checks or fetches it.
"""

from __future__ import annotations

from pathlib import Path

from cachekit import raw_bytes

from astream._cache.engine import ShardEngine
from astream._format.index import Index
from astream._node.provider import CacheProvider, EngineSpec
from astream._storage import StorageOptions
from astream.testing import LoopbackServer

Dataset = tuple[Path, Index]


async def _fill(index: Index, local: Path, server: LoopbackServer, options: StorageOptions) -> None:
    async with ShardEngine(index, str(local), server.url, options=options) as engine:
        for i in range(len(index.shards)):
            async with engine.use(i):
                pass


async def test_a_shard_a_new_run_finds_is_checked_with_validate_hash(
    server: LoopbackServer, dataset: Dataset, tmp_path: Path, options: StorageOptions
) -> None:
    root, index = dataset
    local = tmp_path / "c"
    await _fill(index, local, server, options)
    shard0 = local / index.shards[0].raw_data.basename
    good = shard0.read_bytes()
    shard0.write_bytes(bytes(b ^ 0xFF for b in good))  # same size, other bytes
    spec = EngineSpec(local=str(local), remote=server.url, split=None, validate_hash="xxh64", keep_zip=False,
                      download_retry=1, download_timeout=5.0, cache_limit=None)
    provider = CacheProvider([spec], 4, 1, [index])
    await provider.rebuild()
    try:
        assert provider.lookup("0/0") is None  # (before: its path, from is_ready alone)
        path = await provider.ensure("0/0", lambda stage: None)
        assert Path(path).read_bytes() == raw_bytes(root, index, 0) == good
        assert provider.stats()["hash_failures"] == 1
        assert provider.lookup("0/0") == path  # checked now: served as it is
        assert provider.lookup("0/1") is None  # the others wait for their check too
    finally:
        await provider.aclose()


async def test_a_suspect_shard_is_not_served_unchecked(
    server: LoopbackServer, dataset: Dataset, tmp_path: Path, options: StorageOptions
) -> None:
    _, index = dataset
    local = tmp_path / "c"
    await _fill(index, local, server, options)
    async with ShardEngine(index, str(local), server.url, options=options) as engine:
        assert engine.servable(0) is not None
        engine.cache.entries[0].suspect = True  # as the scan marks one after a power cut
        assert engine.servable(0) is None
        async with engine.use(0):
            pass
        assert engine.servable(0) is not None


async def test_a_ready_shard_whose_file_is_gone_or_cut_is_forgotten(
    server: LoopbackServer, dataset: Dataset, tmp_path: Path, options: StorageOptions
) -> None:
    root, index = dataset
    local = tmp_path / "c"
    async with ShardEngine(index, str(local), server.url, options=options) as engine:
        for i in (0, 1):
            async with engine.use(i):
                pass
        (local / index.shards[0].raw_data.basename).unlink()
        with open(local / index.shards[1].raw_data.basename, "r+b") as fh:
            fh.truncate(10)
        for i in (0, 1):
            assert engine.servable(i) is None  # (before: the path of a file that is gone, or cut)
            assert engine.is_absent(i)
            async with engine.use(i) as path:
                assert Path(path).read_bytes() == raw_bytes(root, index, i)
        assert engine.stats.vanished == 2
        assert not engine.recheck(0)  # there again: nothing to forget
