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


READER = textwrap.dedent(
    """
    import sys, time
    import astream._storage.sink as sink
    from astream import Loader, StreamingDataset

    sink.FLUSH_BYTES = 4096  # what arrives reaches the cache's file at once
    url, local, want = sys.argv[1], sys.argv[2], int(sys.argv[3])
    ds = StreamingDataset(remote=url, local=local, batch_size=16)
    ids = []
    for batch in Loader(ds, batch_size=16):
        ids += batch["id"].tolist()
        if len(ids) >= want:
            break
    print(ids == list(range(len(ids))), flush=True)
    time.sleep(60)  # killed here, its shard still arriving
    """
)


def test_sigkill_while_serving_an_arriving_shard_leaves_nothing_trusted(tmp_path: Path) -> None:
    import threading

    from astream import Loader, MDSWriter, StreamingDataset

    root = tmp_path / "remote"
    with MDSWriter(out=str(root), columns={"id": "int64", "b": "bytes"}, size_limit="256kb") as writer:
        for i in range(2000):
            writer.write({"id": i, "b": bytes([i % 251]) * 200})
    local = tmp_path / "cache"
    size = (root / "shard.00000.mds").stat().st_size
    gate = threading.Event()
    try:
        with LoopbackServer(str(root)) as server:
            server.add(Fault("stall", match="shard.00000.mds", after=int(size * 0.6), ranged=False, gate=gate))
            child = subprocess.Popen([sys.executable, "-c", READER, server.url, str(local), "400"],
                                     stdout=subprocess.PIPE, text=True)
            try:
                assert child.stdout is not None
                assert child.stdout.readline().strip() == "True"  # served, right, while the shard arrived
                assert "shard.00000.mds" not in tree(local)
                assert any("shard.00000.mds" in t for t in temporaries(local))
            finally:
                os.kill(child.pid, signal.SIGKILL)
                child.wait()
                if child.stdout is not None:
                    child.stdout.close()
            gate.set()
            server.clear()
            ds = StreamingDataset(remote=server.url, local=str(local), batch_size=16)
            try:
                ids = [i for batch in Loader(ds, batch_size=16) for i in batch["id"].tolist()]
            finally:
                ds.close()
    finally:
        gate.set()
    assert ids == list(range(2000))
    assert temporaries(local) == []
    assert (local / "shard.00000.mds").read_bytes() == (root / "shard.00000.mds").read_bytes()
