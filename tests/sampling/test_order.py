"""The batch order of a rank (``astream._sampling.order``) against its plain definition."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import assume, given
from hypothesis import strategies as st

from astream._sampling.order import (
    WorkerBatches,
    batch_counts,
    first_batch,
    rank_batches,
    round_robin,
    worker_batches,
)
from astream.errors import ConfigError
from astream.sampling import EpochPlan


def _naive_round_robin(per_worker: list[list[np.ndarray]]) -> list[np.ndarray]:
    """The torch DataLoader's rule, one batch at a time: take from each live worker in turn."""
    out, cursor = [], [0] * len(per_worker)
    while any(cursor[w] < len(b) for w, b in enumerate(per_worker)):
        for w, batches in enumerate(per_worker):
            if cursor[w] < len(batches):
                out.append(batches[cursor[w]])
                cursor[w] += 1
    return out


@given(st.integers(0, 40), st.integers(1, 9), st.booleans())
def test_worker_batches_cut_like_slicing(n: int, size: int, drop_last: bool) -> None:
    ids = np.arange(100, 100 + n, dtype=np.int64)
    wb = WorkerBatches.of(ids, size, drop_last)
    stop = n - n % size if drop_last else n
    want = [ids[a : min(a + size, stop)] for a in range(0, stop, size)]
    assert [b.tolist() for b in wb.batches()] == [b.tolist() for b in want]
    assert wb.num_samples == stop
    assert wb.num_batches == len(want)


@given(st.lists(st.integers(0, 6), max_size=5))
def test_round_robin_is_the_dataloader_rule(counts: list[int]) -> None:
    per_worker = [[np.array([w, k]) for k in range(c)] for w, c in enumerate(counts)]
    want = [int(b[0]) for b in _naive_round_robin(per_worker)]
    assert round_robin(counts).tolist() == want


@given(
    sizes=st.lists(st.integers(0, 60), min_size=1, max_size=6),
    shuffle=st.booleans(),
    nodes=st.integers(1, 2),
    ranks=st.integers(1, 3),
    workers=st.integers(1, 4),
    batch=st.integers(1, 7),
    drop_last=st.booleans(),
    data=st.data(),
)
def test_rank_batches_merge_each_workers_batches(
    sizes: list[int], shuffle: bool, nodes: int, ranks: int, workers: int, batch: int, drop_last: bool,
    data: st.DataObject,
) -> None:
    assume(sum(sizes) >= 4 * nodes)  # fewer samples than canonical nodes is refused (tested elsewhere)
    plan = EpochPlan([{"shard_sizes": sizes}], shuffle=shuffle, batch_size=batch, num_canonical_nodes=nodes,
                     num_physical_nodes=nodes, ranks_per_node=ranks, workers_per_rank=workers, epoch=1)
    node, rank = data.draw(st.integers(0, nodes - 1)), data.draw(st.integers(0, ranks - 1))
    per_worker = []
    for w in range(workers):
        ids = plan.worker_ids(node, rank, w)
        ids = ids[ids >= 0]
        stop = len(ids) - len(ids) % batch if drop_last else len(ids)
        per_worker.append([ids[a : min(a + batch, stop)] for a in range(0, stop, batch)])
    want = _naive_round_robin(per_worker)
    got = rank_batches(plan, node, rank, drop_last=drop_last)
    assert [b.tolist() for b in got] == [b.tolist() for b in want]
    assert batch_counts(plan, node, rank, drop_last=drop_last) == [len(b) for b in per_worker]
    assert [worker_batches(plan, node, rank, w, drop_last=drop_last).num_batches for w in range(workers)] == [
        len(b) for b in per_worker
    ]
    flat = np.concatenate(got).tolist() if got else []
    assert plan.rank_order(node, rank, drop_last=drop_last).tolist() == flat


def test_worker_batches_kept_for_a_second_ask_read_only_and_per_worker() -> None:
    plan = EpochPlan([{"shard_sizes": [50, 70]}], shuffle=True, shuffle_seed=3, batch_size=4,
                     num_physical_nodes=1, ranks_per_node=2, workers_per_rank=2, epoch=1, sample_in_epoch=16)
    first = worker_batches(plan, 0, 1, 1)
    assert worker_batches(plan, 0, 1, 1) is first  # a resume asks twice: one pass over the epoch
    with pytest.raises(ValueError, match="read-only"):
        first.ids[0] = 0
    other = worker_batches(plan, 0, 1, 0)
    assert other is not first
    assert not set(other.ids.tolist()) & set(first.ids.tolist())
    again = worker_batches(plan, 0, 1, 1)
    assert again is not first  # only the last answer is kept
    assert np.array_equal(again.ids, first.ids)
    assert np.array_equal(again.bounds, first.bounds)
    dropped = worker_batches(plan, 0, 1, 1, drop_last=True)
    assert dropped.num_samples == len(first.ids) - len(first.ids) % 4


@given(
    sizes=st.lists(st.integers(0, 60), min_size=1, max_size=6),
    shuffle=st.booleans(),
    nodes=st.integers(1, 2),
    ncn_per_node=st.sampled_from([1, 2, 3]),
    ranks=st.integers(1, 3),
    workers=st.integers(1, 4),
    batch=st.integers(1, 7),
    drop_last=st.booleans(),
    partition_algo=st.sampled_from(["orig", "relaxed"]),
    epoch_size=st.sampled_from([None, 37, 150]),
    data=st.data(),
)
def test_first_batch_is_batch_zero_of_worker_batches_without_the_rest(
    sizes: list[int], shuffle: bool, nodes: int, ncn_per_node: int, ranks: int, workers: int, batch: int,
    drop_last: bool, partition_algo: str, epoch_size: int | None, data: st.DataObject,
) -> None:
    # A resume's first batch (its shards are read ahead at load_state_dict) comes from the
    # partition's first batches alone when unshuffled: the same ids as the whole worker's order.
    ncn = nodes * ncn_per_node
    assume(sum(sizes) >= 4 * ncn)
    total = epoch_size or sum(sizes)
    offset = data.draw(st.integers(0, total))
    try:
        plan = EpochPlan([{"shard_sizes": sizes}], shuffle=shuffle, batch_size=batch, num_canonical_nodes=ncn,
                         num_physical_nodes=nodes, ranks_per_node=ranks, workers_per_rank=workers, epoch=2,
                         sample_in_epoch=offset, partition_algo=partition_algo, epoch_size=epoch_size)
    except ConfigError:
        assume(False)  # (a world this epoch cannot be laid out on: refused, tested elsewhere)
    node, rank = data.draw(st.integers(0, nodes - 1)), data.draw(st.integers(0, ranks - 1))
    worker = data.draw(st.integers(0, workers - 1))
    fresh = EpochPlan.of(plan.streams, plan.options)  # (nothing of the whole order computed yet)
    got = first_batch(fresh, node, rank, worker, drop_last=drop_last)
    # Unshuffled, nothing of the rest of the epoch was computed; shuffled, the whole order
    # was (once), and kept for the reader.
    assert ("_last_worker_batches" in fresh.__dict__) == shuffle
    order = worker_batches(plan, node, rank, worker, drop_last=drop_last)
    want = order.batch(0) if order.num_batches else order.ids[:0]
    assert got.tolist() == want.tolist()
    assert first_batch(plan, node, rank, worker, drop_last=drop_last).tolist() == want.tolist()  # (kept order)
