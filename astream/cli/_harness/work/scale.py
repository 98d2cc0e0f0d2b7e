"""The scale workloads (internal stages: they move with the code they measure): reading a
dataset's index with many shards, by astream's binary node index (``build``: the node's
first process; ``attach``: every other one; ``dataset``: a further process's whole
``StreamingDataset`` construction over it) or its JSON reader (``json``), and by
mosaicml-streaming's (``json.load`` and one reader object per shard, what its ``Stream``
does); seconds, CPU seconds, RSS growth and peak RSS.

:func:`synthetic_index` writes an MDS ``index.json`` of N shards (entries as MDSWriter
writes them: zstd, xxh64), streamed, without holding it.
"""

from __future__ import annotations

import json
import os
import time
from typing import Any

__all__ = ["agent_client", "index", "many_streams", "stream_folders", "synthetic_index"]


def synthetic_index(path: str, shards: int, samples_per_shard: int = 1000) -> str:
    """Write ``path/index.json`` with ``shards`` shards unless it is there; its path."""
    out = os.path.join(path, "index.json")
    if os.path.exists(out):
        return out
    os.makedirs(path, exist_ok=True)
    tmp = out + ".tmp"
    with open(tmp, "w") as f:
        f.write('{"shards": [')
        for i in range(shards):
            entry = {"column_encodings": ["bytes", "int"], "column_names": ["x", "y"], "column_sizes": [None, 8],
                     "compression": "zstd", "format": "mds", "hashes": ["xxh64"],
                     "raw_data": {"basename": f"shard.{i:07d}.mds", "bytes": 67_000_000 + i % 997,
                                  "hashes": {"xxh64": f"{(i * 2654435761) % (1 << 64):016x}"}},
                     "samples": samples_per_shard + i % 7, "size_limit": 67108864, "version": 2,
                     "zip_data": {"basename": f"shard.{i:07d}.mds.zstd", "bytes": 21_000_000 + i % 991,
                                  "hashes": {"xxh64": f"{(i * 40503) % (1 << 64):016x}"}}}
            f.write(("," if i else "") + json.dumps(entry, sort_keys=True))
        f.write('], "version": 2}')
    os.replace(tmp, out)
    return out


def _vm(field: str) -> float:
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    return 0.0


def index(lib: str, what: str, root: str, mem_cap_mb: int | None = None) -> dict[str, Any]:
    """Read ``root/index.json`` one way; ``build`` removes the binary form first."""
    if mem_cap_mb:
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (mem_cap_mb << 20, mem_cap_mb << 20))
    import numpy as np

    index_json = os.path.join(root, "index.json")
    if lib == "mosaicml":
        from . import stub_streaming_vision

        stub_streaming_vision()
        from streaming.base.format import reader_from_json
    else:
        from astream._cache.node_index import attach_index, binary_path
        from astream._format.index import Index

        if what == "build" and os.path.exists(binary_path(index_json)):
            os.unlink(binary_path(index_json))
        if what == "dataset":  # a further process of the node: the node's first built it (elsewhere)
            import subprocess
            import sys

            subprocess.run([sys.executable, "-c", "import sys; from astream._cache.index_file import node_index; "
                            "node_index(sys.argv[1], True)", index_json], check=True)
    base = _vm("VmRSS")
    start, cpu = time.perf_counter(), time.process_time()
    if lib == "mosaicml":
        with open(index_json) as f:
            obj = json.load(f)
        shards = [reader_from_json(root, None, s) for s in obj["shards"]]
        sizes = np.array([s.samples for s in shards], np.int64)
    elif what == "json":
        sizes = np.array(Index.load(index_json).shard_sizes, np.int64)
    elif what == "dataset":
        from astream import StreamingDataset

        ds = StreamingDataset(local=root, shuffle=True, batch_size=32)
        sizes = ds.sample_map.stream_shard_sizes()[0]
    else:
        got = attach_index(index_json)
        sizes = got.shards.samples  # type: ignore[attr-defined]
    total = int(sizes.sum())
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    # The growth of the peak: what reading it cost at its worst (a parse's objects are gone
    # by the end); what stays (a map's touched pages) is ``rss_kept_mb``.
    return {"seconds": seconds, "cpu_seconds": cpu, "rss_growth_mb": _vm("VmHWM") - base,
            "rss_kept_mb": _vm("VmRSS") - base, "peak_rss_mb": _vm("VmHWM"), "samples": total,
            "shards": len(sizes)}


def stream_folders(root: str, base: str, count: int) -> list[str]:
    """``count`` stream folders under ``root``, each the dataset ``base`` by hard links (no
    new inodes, no copies), made once."""
    files = sorted(os.listdir(base))
    out = []
    for i in range(count):
        folder = os.path.join(root, f"s{i:05d}")
        if not os.path.exists(os.path.join(folder, "index.json")):
            os.makedirs(folder, exist_ok=True)
            for f in files:
                if not os.path.exists(os.path.join(folder, f)):
                    os.link(os.path.join(base, f), os.path.join(folder, f))
        out.append(folder)
    return out


def many_streams(root: str, base: str, count: int, mem_cap_mb: int | None = None) -> dict[str, Any]:
    """A StreamingDataset of ``count`` local streams (each a copy of ``base``), shuffled:
    construction, then the first batch of a Loader; seconds, CPU seconds, peak RSS."""
    if mem_cap_mb:
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (mem_cap_mb << 20, mem_cap_mb << 20))
    from astream import Loader, Stream, StreamingDataset

    folders = stream_folders(root, base, count)
    start, cpu = time.perf_counter(), time.process_time()
    ds = StreamingDataset(streams=[Stream(local=f) for f in folders], batch_size=32, shuffle=True)
    built, built_cpu = time.perf_counter() - start, time.process_time() - cpu
    it = iter(Loader(ds, batch_size=32, num_workers=0))
    batch = next(it)
    first, first_cpu = time.perf_counter() - start - built, time.process_time() - cpu - built_cpu
    del it, batch
    return {"seconds": built + first, "cpu_seconds": built_cpu + first_cpu, "construct_s": built,
            "construct_cpu_s": built_cpu, "first_batch_s": first, "first_batch_cpu_s": first_cpu,
            "peak_rss_mb": _vm("VmHWM")}


def agent_client(local: str, remote: str, run_id: str, key: str, start_at: float, seconds: float,
                 keep: int = 3000) -> dict[str, Any]:
    """One light client of a node agent (the first to connect starts it, in its own process):
    ``ensure`` of a cached shard in a closed loop from ``start_at`` for ``seconds``; its
    request count and rate, a sample of its latencies (µs), and the agent's CPU seconds
    before and after (``stats``)."""
    import asyncio
    import sys

    sys.path.insert(0, os.getcwd())  # the checkout: the tests' whole-file fetcher, by its pickled name
    from astream._coord.client import AsyncNodeClient
    from astream._coord.config import CoordConfig
    from astream._coord.launch import new_event_loop
    from astream._coord.world import World
    from tests.coord.simple_provider import SimpleProviderFactory

    rank, size = int(os.environ.get("RANK", "0")), int(os.environ.get("WORLD_SIZE", "1"))

    async def run() -> dict[str, Any]:
        world = World(rank=rank, world_size=size, local_rank=rank, ranks_per_node=size)
        config = CoordConfig(agent_linger=2.0, connect_timeout=120.0, watch_warn_after=600.0)
        async with AsyncNodeClient(local, SimpleProviderFactory(remote, local), run_id=run_id, world=world,
                                   config=config) as node:
            await node.ensure(key)
            await asyncio.sleep(max(0.0, start_at - time.time()))
            agent_before = float((await node.stats())["cpu_s"])
            late = max(0.0, time.time() - start_at)
            lat: list[float] = []
            t0 = time.perf_counter()
            stop = t0 + max(0.1, seconds - late)
            now = t0
            while now < stop:
                await node.ensure(key)
                after = time.perf_counter()
                lat.append(after - now)
                now = after
            elapsed = now - t0
            agent_after = float((await node.stats())["cpu_s"])
            # Every client keeps its link until all have measured: a closing one would
            # leave the agent with fewer clients than the point names.
            await asyncio.sleep(max(0.0, start_at + seconds + 1.0 - time.time()))
        step = max(1, len(lat) // keep)
        return {"requests": len(lat), "elapsed_s": elapsed, "late_s": late, "rate": len(lat) / max(elapsed, 1e-9),
                "latencies_us": [round(x * 1e6, 1) for x in sorted(lat)[::step]],
                "agent_cpu_before": agent_before, "agent_cpu_after": agent_after}

    loop = new_event_loop()
    try:
        return loop.run_until_complete(run())
    finally:
        loop.close()
