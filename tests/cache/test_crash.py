"""A process SIGKILLed in the middle of a download leaves nothing a later run would trust."""
# ruff: noqa: ASYNC240

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

from cachekit import raw_bytes, temporaries, tree
from prefetcher import Prefetcher

from astream._cache import ShardEngine
from astream._format.index import Index
from astream._storage import StorageOptions
from astream.testing import Fault, LoopbackServer

CHILD = textwrap.dedent(
    """
    import asyncio, sys
    import astream._storage.sink as sink
    from astream._cache import ShardEngine, load_index

    sink.FLUSH_BYTES = 1024  # reach the disk early, so the kill lands mid-file

    async def main(url, local):
        index = await load_index(local, url)
        async with ShardEngine(index, local, url) as engine:
            for i in range(len(index.shards)):
                await engine.ensure(i)

    asyncio.run(main(sys.argv[1], sys.argv[2]))
    """
)


def test_sigkill_mid_download_then_a_clean_run(dataset: tuple[Path, Index], tmp_path: Path, options: StorageOptions) -> None:
    root, index = dataset
    local = tmp_path / "cache"
    with LoopbackServer(str(root)) as server:
        server.add(Fault("stall", match="shard.00001.mds.zstd", after=5000, seconds=30))
        child = subprocess.Popen([sys.executable, "-c", CHILD, server.url, str(local)])
        try:
            deadline = time.monotonic() + 30
            while not any("shard.00001" in t for t in temporaries(local)):
                assert child.poll() is None, "the child ended before the stall"
                assert time.monotonic() < deadline, "no temporary appeared"
                time.sleep(0.02)
        finally:
            os.kill(child.pid, signal.SIGKILL)
            child.wait()
        assert "shard.00000.mds" in tree(local)
        assert "shard.00001.mds" not in tree(local)  # only a temporary, which no one trusts
        server.clear()

        async def rerun() -> None:
            async with ShardEngine(index, str(local), server.url, options=options) as engine:
                async with Prefetcher(engine, range(4)) as shards:
                    async for lease in shards:
                        with lease:
                            assert Path(lease.path).read_bytes() == raw_bytes(root, index, lease.shard)
                assert engine.stats.hits == 1  # shard 0 was complete and is reused

        from astream._storage.loop import run

        run(rerun())
    assert temporaries(local) == []
    assert tree(local) == ["index.json", *(f"shard.{i:05d}.mds" for i in range(4))]
