"""Worker -> consumer batch transport against the machine's copy bandwidth.

What it does: a worker process (forkserver, as the loader starts them) sends ``--batches``
batches of ``{"x": (32, sample_bytes/4) float32, "id": 32 int64}`` through the loader's
transport (:class:`astream._dataset.transport.PipeWriter` on its event loop, the
consumer's :func:`recv_object` in the main thread, which keeps the last 3 batches alive,
as a training loop and the prefetch queues do). Four source arrays rotate, so the
worker's reads are not all cache hits. Variants, alternated, ``--runs`` each:

- ``slabs``: the ring of shared-memory slots (the default path);
- ``files``: the ring switched off: a fresh anonymous file per large buffer (the path
  before the slots, and the one a worker falls back to when every slot is held);
- ``pipe``: no descriptor channel: every buffer through the pipe.

And the copy floor, in the driver: ``np.copyto`` of one batch's bytes, ``hot`` (the same
source into the same destination: the bytes stay in the CPU caches) and ``rotating``
(4 sources into 8 destinations, as the transport's slots rotate: memory bandwidth).

Usage::

    .venv/bin/python benchmarks/transport_bench.py --runs 5 --sample-kb 100
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing as mp
import os
import statistics
import time
from multiprocessing.connection import Connection
from typing import Any

import numpy as np

BATCH = 32


def _producer(conn: Connection, files: Connection | None, count: int, floats: int, variant: str) -> None:
    from astream._dataset import slabs
    from astream._dataset.spawn import _socket_of
    from astream._dataset.transport import PipeWriter

    if variant == "files":
        slabs.SlabRing.take = lambda self, nbytes: None  # type: ignore[method-assign]
    channel = _socket_of(files) if files is not None else None
    sources = [np.full((BATCH, floats), i, np.float32) for i in range(4)]

    async def main() -> None:
        writer = await PipeWriter.open(conn, channel)
        for i in range(count):
            await writer.send(("batch", {"x": sources[i % 4], "id": np.arange(BATCH) + i}))
        await writer.send(("end", None))
        await writer.aclose()

    asyncio.run(main())


def one_run(variant: str, count: int, floats: int) -> float:
    """MB/s of one run (from the second batch: the first one starts the worker)."""
    from astream._dataset.slabs import SlabViews
    from astream._dataset.spawn import _socket_of, _widen
    from astream._dataset.transport import recv_object

    ctx = mp.get_context("forkserver")
    ctx.set_forkserver_preload(["astream._dataset.transport", "numpy"])
    reader, writer = ctx.Pipe(duplex=False)
    _widen(reader)
    channel = slabs = files_in = None
    if variant != "pipe":
        files_out, files_in = ctx.Pipe(duplex=True)
        channel = _socket_of(files_out)
        slabs = SlabViews(channel)
    proc = ctx.Process(target=_producer, args=(writer, files_in, count, floats, variant))  # type: ignore[attr-defined]
    proc.start()
    writer.close()
    if files_in is not None:
        files_in.close()
    held: list[Any] = []
    recv_object(reader, channel, slabs)
    start, n = time.perf_counter(), 0
    while True:
        kind, batch = recv_object(reader, channel, slabs)
        if kind != "batch":
            break
        assert int(batch["x"][0, 0]) == (n + 1) % 4
        held = [*held[-2:], batch]
        n += 1
    elapsed = time.perf_counter() - start
    proc.join()
    if slabs is not None:
        slabs.close()
    if channel is not None:
        channel.close()
    reader.close()
    return n * BATCH * floats * 4 / elapsed / 1e6


def copy_floor(floats: int, rotating: bool) -> float:
    sources = [np.full((BATCH, floats), i, np.float32) for i in range(4 if rotating else 1)]
    targets = [np.empty_like(sources[0]) for _ in range(8 if rotating else 1)]
    times = []
    for i in range(400):
        t = time.perf_counter()
        np.copyto(targets[i % len(targets)], sources[i % len(sources)])
        times.append(time.perf_counter() - t)
    return sources[0].nbytes / statistics.median(times) / 1e6


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--batches", type=int, default=400)
    p.add_argument("--sample-kb", type=int, default=100)
    p.add_argument("--variants", nargs="*", default=["slabs", "files", "pipe"])
    args = p.parse_args()
    floats = args.sample_kb * 1024 // 4
    rates: dict[str, list[float]] = {v: [] for v in args.variants}
    loads = []
    for _ in range(args.runs):
        for variant in args.variants:
            rates[variant].append(one_run(variant, args.batches, floats))
            loads.append(os.getloadavg()[0])
    hot, rotating = copy_floor(floats, False), copy_floor(floats, True)
    mb = BATCH * floats * 4 / 1e6
    print(f"batch: {BATCH} x {args.sample_kb} KB = {mb:.1f} MB; load average {min(loads):.1f}-{max(loads):.1f}")
    print(f"copy floor: hot {hot:,.0f} MB/s, rotating {rotating:,.0f} MB/s")
    print("| transport | MB/s (median) | runs | vs hot copy | vs rotating copy |")
    print("|---|---:|---|---:|---:|")
    for variant, values in rates.items():
        med = statistics.median(values)
        runs = ", ".join(f"{v:,.0f}" for v in values)
        print(f"| {variant} | {med:,.0f} | {runs} | {med / hot:.2f}x | {med / rotating:.2f}x |")


if __name__ == "__main__":
    main()
