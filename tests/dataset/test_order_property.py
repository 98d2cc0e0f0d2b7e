"""What a Loader yields is the order ``astream._sampling.order`` authors, in every world.

Random configurations (nodes, ranks per node, workers, batch size, drop_last, shuffle
algorithm, resume point): every simulated rank iterates its Loader (worker threads or
none) concurrently, and each rank's batches must be ``rank_batches`` of the plan,
batch for batch; ``Loader.batch_ids`` and ``len(loader)`` must say the same.
"""

from __future__ import annotations

import asyncio
import itertools
from pathlib import Path

import pytest
from helpers import close_all, make_rank_datasets
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from astream import MDSWriter
from astream._dataset.loader import Loader
from astream._sampling.order import rank_batches


@pytest.fixture(scope="module")
def layouts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("layouts")
    with MDSWriter(out=str(root / "ds"), columns={"id": "int64"}, size_limit=200) as w:
        for i in range(137):  # several small shards; the id column is the global sample id
            w.write({"id": i})
    return root


_counter = itertools.count()


@settings(max_examples=12, suppress_health_check=[HealthCheck.function_scoped_fixture], deadline=None)
@given(
    nodes=st.integers(1, 2),
    ranks=st.integers(1, 3),
    workers=st.integers(0, 3),
    batch=st.integers(1, 9),
    drop_last=st.booleans(),
    algo=st.sampled_from(["naive", "py1e", "py1s", "py2s", "py1br", "py1b"]),
    shuffle=st.booleans(),
    resume_fraction=st.sampled_from([0.0, 0.0, 0.3, 0.77]),
)
def test_loader_yields_the_authored_order(
    layouts: Path, tmp_path: Path, nodes: int, ranks: int, workers: int, batch: int, drop_last: bool,
    algo: str, shuffle: bool, resume_fraction: float,
) -> None:
    name = f"order{next(_counter)}"
    datasets = make_rank_datasets(
        [{"layout": "ds"}], layouts, tmp_path / name, {"num_physical_nodes": nodes, "ranks_per_node": ranks},
        run_id=name, batch_size=batch, shuffle=shuffle, shuffle_algo=algo, shuffle_block_size=20,
        num_canonical_nodes=nodes * 2,
    )
    epoch_size = datasets[0].plan(epoch=0, sample_in_epoch=0, workers_per_rank=1).epoch_size
    # Resume points on a global-batch boundary, where MosaicML's arithmetic resumes exactly.
    global_batch = batch * nodes * ranks
    resume = int(epoch_size * resume_fraction) // global_batch * global_batch
    loaders = [Loader(ds, num_workers=workers, worker_mode="thread", drop_last=drop_last) for ds in datasets]
    if resume:
        for ds in datasets:
            state = ds.state_dict(0, from_beginning=True)
            ds.load_state_dict({**state, "sample_in_epoch": resume})

    async def one(loader: Loader) -> list[list[int]]:
        return [batch["id"].tolist() async for batch in loader]

    async def go() -> list[list[list[int]]]:
        try:  # all ranks at once: the node's barriers need every one of them
            return list(await asyncio.gather(*(one(loader) for loader in loaders)))
        finally:
            await close_all(datasets)

    got = asyncio.run(go())
    for ds, loader, batches in zip(datasets, loaders, got, strict=True):
        plan = ds.plan(epoch=0, sample_in_epoch=resume, workers_per_rank=max(1, workers), batch_size=batch)
        want = [b.tolist() for b in rank_batches(plan, ds.world.node, ds.world.local_rank, drop_last=drop_last)]
        assert batches == want, f"rank {ds.world.rank}: the Loader left the authored order"
        assert [b.tolist() for b in loader.batch_ids(0, resume)] == want
    for ds in datasets:
        ds.close()
