"""Workloads of the MDS format itself, over local files: a writer's time (astream's or
mosaicml-streaming's, the same samples) and per-sample and batched reads."""

from __future__ import annotations

import os
import time
from typing import Any

from . import stub_streaming_vision
from .samples import COLUMNS, sample

__all__ = ["read", "write"]


def write(lib: str, shape: str, count: int, out: str, size_limit: str = "16mb", fsync: bool = True) -> dict[str, Any]:
    """Seconds to write ``count`` samples of ``shape`` (made before the clock starts) with
    ``lib``'s ``MDSWriter``; ``fsync=False`` stubs ``os.fsync`` out (what durability costs)."""
    samples = [sample(shape, i) for i in range(count)]
    writer_class: Any
    if lib == "astream":
        from astream import MDSWriter

        writer_class = MDSWriter
    else:
        stub_streaming_vision()
        import streaming

        writer_class = streaming.MDSWriter
    if not fsync:
        os.fsync = lambda fd: None
    start = time.perf_counter()
    with writer_class(out=out, columns=COLUMNS[shape], size_limit=size_limit, exist_ok=True) as writer:
        for s in samples:
            writer.write(s)
    return {"write_s": time.perf_counter() - start, "bytes": sum(
        os.path.getsize(os.path.join(out, n)) for n in os.listdir(out) if n.startswith("shard."))}


def read(lib: str, folder: str, batch: int = 256, seed: int = 1) -> dict[str, Any]:
    """Seconds to read every sample in a random order one by one (``ds[i]``), and, for astream,
    in batches of ``batch`` random ids (``get_batch``), of a local MDS folder."""
    import numpy as np

    if lib == "astream":
        from astream import LocalDataset

        ds: Any = LocalDataset(folder)
        ds.get_batch([0])  # open the lazily mapped shards outside the clock, as the peer's are
    else:
        stub_streaming_vision()
        from streaming.base import LocalDataset as MosaicLocal

        ds = MosaicLocal(local=folder)
    order = np.random.default_rng(seed).permutation(len(ds))
    start = time.perf_counter()
    for i in order.tolist():
        ds[i]
    out = {"get_s": time.perf_counter() - start, "samples": len(order)}
    if lib == "astream":
        start = time.perf_counter()
        for k in range(0, len(order), batch):
            ds.get_batch(order[k:k + batch])
        out["get_batch_s"] = time.perf_counter() - start
        ds.close()
    return out
