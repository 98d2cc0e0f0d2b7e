"""Running several simulated ranks of a job inside one test process."""

from __future__ import annotations

import asyncio
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from astream._coord.config import CoordConfig
from astream._coord.world import World
from astream._dataset.dataset import StreamingDataset
from astream._dataset.loader import Loader
from astream._dataset.stream import Stream

THREAD_AGENT = CoordConfig(agent_mode="thread", connect_timeout=20, barrier_timeout=30)


def make_rank_datasets(
    streams: Sequence[dict[str, Any]],
    layouts: Path,
    cache: Path,
    world: dict[str, int],
    run_id: str,
    **kwargs: Any,
) -> list[StreamingDataset]:
    """One dataset per rank of ``world``; each simulated node has its own cache folder."""
    nodes, per_node = world["num_physical_nodes"], world["ranks_per_node"]
    out = []
    for rank in range(nodes * per_node):
        node = rank // per_node
        srcs = [
            Stream(remote=str(layouts / s["layout"]), local=str(cache / f"node{node}" / f"s{i}"),
                   proportion=s.get("proportion"), repeat=s.get("repeat"), choose=s.get("choose"))
            for i, s in enumerate(streams)
        ]
        w = World(rank=rank, world_size=nodes * per_node, local_rank=rank % per_node, ranks_per_node=per_node)
        out.append(StreamingDataset(streams=srcs, world=w, run_id=f"{run_id}-node{node}", coord=THREAD_AGENT,
                                    **kwargs))
    return out


async def iterate_ranks(
    datasets: Sequence[StreamingDataset],
    *,
    num_workers: int | None = None,
    batch_size: int | None = None,
    take_batches: int | None = None,
    loaders: Sequence[Loader] | None = None,
) -> list[list[int]]:
    """Iterate every rank concurrently (barriers need them all); returns each rank's ids.

    ``num_workers=None`` iterates the datasets directly; otherwise through ``Loader``s.
    """

    async def one(i: int, ds: StreamingDataset) -> list[int]:
        if num_workers is None:
            return [int(sample["id"]) async for sample in ds]
        ids: list[int] = []
        loader = loaders[i] if loaders is not None else Loader(ds, batch_size=batch_size, num_workers=num_workers,
                                                               worker_mode="thread")
        it = loader.__aiter__()
        n = 0
        async for batch in it:
            ids.extend(int(x) for x in batch["id"])
            n += 1
            if take_batches is not None and n == take_batches:
                await it.aclose()
                break
        return ids

    return list(await asyncio.gather(*(one(i, ds) for i, ds in enumerate(datasets))))


async def close_all(datasets: Sequence[StreamingDataset]) -> None:
    for ds in datasets:
        await ds.aclose()


def run(coro_factory: Callable[[], Any]) -> Any:
    return asyncio.run(coro_factory())
