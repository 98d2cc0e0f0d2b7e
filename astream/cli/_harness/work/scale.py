"""The scale workloads (internal stages: they move with the code they measure): reading a
dataset's index with many shards, by astream's binary node index (``build``: the node's
first process; ``attach``: every other one) or its JSON reader (``json``), and by
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

__all__ = ["index", "synthetic_index"]


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
        from streaming.base.format import reader_from_json
    else:
        from astream._cache.node_index import attach_index, binary_path
        from astream._format.index import Index

        if what == "build" and os.path.exists(binary_path(index_json)):
            os.unlink(binary_path(index_json))
    base = _vm("VmRSS")
    start, cpu = time.perf_counter(), time.process_time()
    if lib == "mosaicml":
        with open(index_json) as f:
            obj = json.load(f)
        shards = [reader_from_json(root, None, s) for s in obj["shards"]]
        sizes = np.array([s.samples for s in shards], np.int64)
    elif what == "json":
        sizes = np.array(Index.load(index_json).shard_sizes, np.int64)
    else:
        got = attach_index(index_json)
        sizes = got.shards.samples  # type: ignore[attr-defined]
    total = int(sizes.sum())
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    return {"seconds": seconds, "cpu_seconds": cpu, "rss_growth_mb": _vm("VmRSS") - base,
            "peak_rss_mb": _vm("VmHWM"), "samples": total, "shards": len(sizes)}
