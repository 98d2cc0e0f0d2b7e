"""Workloads over MDS datasets: one library's loader for some epochs, a simulated
accelerator, and the transfer floor (aiohttp alone). Each runs in a fresh process."""

from __future__ import annotations

import os
import time
from collections.abc import Callable, Iterable
from typing import Any

from . import BATCH, length, stub_streaming_vision, tree_cpu_s

__all__ = ["accelerate", "ids", "raw", "stream", "train"]


def _keep_bytes(samples: list[dict[str, Any]]) -> dict[str, Any]:
    """LitData's collate: arrays stacked, bytes/str/ints kept as lists (its default collate
    turns a ``memoryview`` value into one tensor per byte position: wrong, and 75x slower)."""
    import torch

    out: dict[str, Any] = {}
    for key in samples[0]:
        values = [s[key] for s in samples]
        if isinstance(values[0], memoryview):
            out[key] = [bytes(v) for v in values]
        elif hasattr(values[0], "shape"):
            out[key] = torch.stack([torch.as_tensor(v) for v in values])
        else:
            out[key] = values
    return out


def _imports(lib: str) -> None:
    if lib == "astream":
        import astream  # noqa: F401
    elif lib == "mosaicml":
        stub_streaming_vision()
        import streaming  # noqa: F401
        import torch.utils.data  # noqa: F401
    elif lib == "litdata":
        import litdata  # noqa: F401
    else:
        raise ValueError(f"no MDS loader for library {lib!r}")


def _make(lib: str, remote: str | None, local: str, batch: int, workers: int, shuffle: bool, how: str,
          canonical_nodes: int | None, epoch_size: int | None) -> tuple[Any, Any, Callable[[], None]]:
    """(dataset, what to iterate, close) of one library."""
    if lib == "astream":
        from astream import Loader, StreamingDataset

        ds = StreamingDataset(remote=remote, local=local, batch_size=batch, shuffle=shuffle,
                              num_canonical_nodes=canonical_nodes, epoch_size=epoch_size)
        loader = Loader(ds, batch_size=batch, num_workers=workers) if how == "loader" else None

        def close() -> None:
            if loader is not None:
                loader.close()
            ds.close()

        return ds, loader if loader is not None else ds, close
    if lib == "mosaicml":
        from streaming import StreamingDataset as MosaicDataset
        from torch.utils.data import DataLoader

        mds = MosaicDataset(remote=remote, local=local, batch_size=batch, shuffle=shuffle,
                            num_canonical_nodes=canonical_nodes)
        items = DataLoader(mds, batch_size=batch, num_workers=workers) if how == "loader" else mds
        return mds, items, lambda: None
    from litdata import StreamingDataLoader
    from litdata import StreamingDataset as LitDataset

    lds = LitDataset(input_dir=remote or local, shuffle=shuffle)
    lit = StreamingDataLoader(lds, batch_size=batch, num_workers=workers, collate_fn=_keep_bytes)
    return lds, lit if how == "loader" else lds, lambda: None


def _epoch(items: Iterable[Any], count: Callable[[Any], int], start: float, first_only: bool) -> dict[str, Any]:
    first, n, cpu0 = None, 0, tree_cpu_s()
    for item in items:
        if first is None:
            first = time.perf_counter() - start
        n += count(item)
        if first_only:
            break
    return {"first_s": first, "total_s": time.perf_counter() - start, "samples": n, "cpu_s": tree_cpu_s() - cpu0}


def stream(lib: str, remote: str | None, local: str, batch: int = BATCH, workers: int = 0, shuffle: bool = False,
           epochs: int = 1, how: str = "loader", resume: int = 0, pause_s: float = 0.0,
           canonical_nodes: int | None = None, epoch_size: int | None = None) -> dict[str, Any]:
    """``epochs`` epochs of one library's loader (``how="loader"``) or of ``for sample in ds``
    (``"iter"``). The first epoch counts from before the dataset's construction (a cold cache's
    downloads and the workers' start included; imports apart, in ``import_s``), or from the end
    of a pause of ``pause_s`` (the program building its model) when one is given; the later ones each
    from their own start. ``resume``: start at that sample of the epoch (a state dict loaded
    into the fresh loader) and stop at the first batch."""
    wall0 = time.time()
    t0 = time.perf_counter()
    _imports(lib)
    import_s = time.perf_counter() - t0
    start = time.perf_counter()
    ds, items, close = _make(lib, remote, local, batch, workers, shuffle, how, canonical_nodes, epoch_size)
    built_s = time.perf_counter() - start
    if resume:
        state = {"epoch": 0, "sample_in_epoch": resume, "num_canonical_nodes": canonical_nodes or 1,
                 "shuffle_seed": 9176, "initial_physical_nodes": 1}
        (ds if lib == "mosaicml" else items).load_state_dict(state)
    paused = {}
    if pause_s:
        time.sleep(pause_s)
        paused = {"paused_s": time.perf_counter() - start}
    count = length if how == "loader" else (lambda _: 1)
    runs = [_epoch(items, count, time.perf_counter() if pause_s else start, bool(resume))]
    runs += [_epoch(items, count, time.perf_counter(), False) for _ in range(epochs - 1)]
    close()
    return {"import_s": import_s, "built_s": built_s, "wall0": wall0, "epochs": runs, **paused}


def accelerate(lib: str, remote: str | None, local: str, batch: int, workers: int, steps: int, step_s: float,
               barrier: str | None = None) -> dict[str, Any]:
    """A simulated accelerator (MLPerf Storage style): a shuffled loader whose loop sleeps
    ``step_s`` a batch. Every rank starts its measured steps once all have a first batch
    (they meet in the folder ``barrier``); reports each ``next()``'s wait, the compute and
    wall time from then on, and the CPU seconds of its process tree meanwhile."""
    _imports(lib)
    _, loader, close = _make(lib, remote, local, batch, workers, True, "loader", None, None)
    steps = min(steps, len(loader))
    it = iter(loader)
    began = time.perf_counter()
    next(it)
    first_batch_s = time.perf_counter() - began
    if barrier:
        world = int(os.environ.get("WORLD_SIZE", "1"))
        open(os.path.join(barrier, f"ready.{os.environ.get('RANK', '0')}"), "w").close()
        while sum(1 for name in os.listdir(barrier) if name.startswith("ready.")) < world:
            time.sleep(0.005)
    cpu0, start, compute, waits = tree_cpu_s(), time.perf_counter(), 0.0, []
    for _ in range(steps - 1):
        asked = time.perf_counter()
        next(it)
        got = time.perf_counter()
        waits.append(got - asked)
        time.sleep(step_s)
        compute += time.perf_counter() - got  # the step as long as it took (a loaded machine oversleeps)
    wall = time.perf_counter() - start
    cpu = tree_cpu_s() - cpu0
    del it
    close()
    return {"steps": steps, "waits": waits, "compute_s": compute, "wall_s": wall, "first_batch_s": first_batch_s,
            "samples": (steps - 1) * batch, "cpu_s": cpu}


def train(remote: str, local: str, batch: int, step_s: float, seed: int, cache_limit: int | None = None,
          predownload: int | None = None) -> dict[str, Any]:
    """One shuffled epoch of astream's ``Loader`` (no workers) under a training loop that
    sleeps ``step_s`` a batch: the seconds it waited in ``next()`` (``loader.stats()``), the
    epoch's wall time and the node's downloads (``ds.stats()``)."""
    import warnings

    from astream import Loader, StreamingDataset

    ds = StreamingDataset(remote=remote, local=local, batch_size=batch, shuffle=True, shuffle_seed=seed,
                          cache_limit=cache_limit, predownload=predownload)
    start = time.perf_counter()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a cache limit below the advised one warns
        loader = Loader(ds)
        for _ in loader:
            time.sleep(step_s)  # the simulated training step
        stats = loader.stats()
    wall = time.perf_counter() - start
    downloads = ds.stats().shards_downloaded
    loader.close()
    ds.close()
    return {"wait_s": stats.consumer_wait_s, "epoch_s": wall, "downloads": downloads}


def ids(lib: str, remote: str, local: str, batch: int, cache_limit: int, block: int | None,
        canonical_nodes: int) -> dict[str, Any]:
    """One rank's shuffled epoch (py1e) under a cache limit, direct iteration: the ids it read,
    in order, and the epoch's seconds."""
    if lib == "astream":
        from astream import StreamingDataset
    else:
        stub_streaming_vision()
        from streaming import StreamingDataset  # type: ignore[no-redef]
    ds = StreamingDataset(remote=remote, local=local, shuffle=True, shuffle_algo="py1e", shuffle_block_size=block,
                          batch_size=batch, cache_limit=cache_limit, num_canonical_nodes=canonical_nodes)
    start = time.perf_counter()
    got = [int(sample["id"]) for sample in ds]
    seconds = time.perf_counter() - start
    if lib == "astream":
        ds.close()
    return {"ids": got, "seconds": seconds}


def raw(url: str, local: str, concurrency: int = 4, batch: int = BATCH) -> dict[str, Any]:
    """The transfer floor: aiohttp alone fetches index.json, one ranged read of the first
    shard's offset table and first batch (the first batch's floor), then every stored shard
    file to disk, ``concurrency`` at a time."""
    import json

    t0 = time.perf_counter()
    import asyncio

    import aiohttp

    import_s = time.perf_counter() - t0
    out: dict[str, Any] = {"import_s": import_s}

    async def fetch_all() -> None:
        async with aiohttp.ClientSession(auto_decompress=False) as session:
            async with session.get(f"{url}/index.json") as resp:
                index = json.loads(await resp.read())
            names = [(s.get("zip_data") or s["raw_data"])["basename"] for s in index["shards"]]
            out["index_s"] = time.perf_counter() - t0
            first = index["shards"][0]
            stored, raw_bytes = (first.get("zip_data") or first["raw_data"])["bytes"], first["raw_data"]["bytes"]
            share = 4 + 4 * (first["samples"] + 1) + batch * 1.25 * raw_bytes / first["samples"]
            stop = min(stored, int(share * stored / raw_bytes) + (64 << 10))
            async with session.get(f"{url}/{names[0]}", headers={"Range": f"bytes=0-{stop - 1}"}) as resp:
                await resp.read()
            out["first_s"] = time.perf_counter() - t0
            gate = asyncio.Semaphore(concurrency)

            async def one(name: str) -> None:
                async with gate, session.get(f"{url}/{name}") as resp:
                    resp.raise_for_status()
                    fd = os.open(os.path.join(local, name), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                    try:
                        async for chunk in resp.content.iter_chunked(1 << 20):
                            os.write(fd, chunk)
                    finally:
                        os.close(fd)

            await asyncio.gather(*(one(n) for n in names))

    asyncio.run(fetch_all())
    total = time.perf_counter() - t0
    out["epochs"] = [{"first_s": out["first_s"], "total_s": total, "samples": 0, "cpu_s": tree_cpu_s()}]
    return out
