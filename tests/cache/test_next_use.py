"""The plan-aware eviction policy and its simulation (pure: no cache, no network)."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from astream._cache.eviction import Candidate, NodePlan, choose_victims, min_cache_bytes, runs_of
from astream._cache.simulation import offline_optimum, simulate
from astream._sampling.plan import EpochPlan
from astream.errors import CacheError


def test_farthest_next_use_goes_first_and_never_used_before_that() -> None:
    cands = [Candidate(0, 10, 9, next_use=3), Candidate(1, 10, 1, next_use=math.inf),
             Candidate(2, 10, 5, next_use=40), Candidate(3, 10, 2, pinned=True, next_use=math.inf)]
    assert choose_victims(cands, 40, 15, 40) == [1, 2]
    assert choose_victims(cands, 40, 35, 40) is None  # the pinned one stays


def test_a_prefetch_waits_when_the_shard_belady_would_drop_is_read_before() -> None:
    # ranked as they stand when the prefetched shard is read: 0 is dead by then, but read before it
    cands = [Candidate(0, 10, 0, next_use=math.inf, soon=True), Candidate(1, 10, 0, next_use=7)]
    assert choose_victims(cands, 20, 10, 20) is None
    cands = [Candidate(0, 10, 0, next_use=3, soon=True), Candidate(1, 10, 0, next_use=7)]
    assert choose_victims(cands, 20, 10, 20) == [1]


def test_runs_and_distances() -> None:
    shards = np.array([4, 4, 2, 7, 4, 2, 2], np.int64)
    keys, starts, ends = runs_of(shards)
    assert keys.tolist() == [4, 2, 7, 4, 2]
    assert starts.tolist() == [0, 2, 3, 4, 5]
    assert ends.tolist() == [1, 2, 3, 4, 6]
    plan = NodePlan()
    plan.add("a", keys.tolist(), starts.tolist(), ends.tolist(), window=3)
    plan.add("b", [2], [10], [10])
    assert plan.distance(4) == 0
    assert plan.distance(7) == 3
    plan.advance("a", 1)
    assert plan.distance(4) == 0  # position 1 is still in the run
    assert plan.distance(4, after=1) == 3
    plan.advance("a", 5)
    assert plan.distance(4) == math.inf
    assert plan.distance(2) == 0
    assert [k for _, k in plan.upcoming()] == [2]
    plan.remove("a")
    assert plan.distance(2) == 10


def _world_orders(algo: str, ranks: int, workers: int, batch: int, block: int | None) -> list[np.ndarray]:
    sizes = [7] * 30 + [3]
    out = []
    for rank in range(ranks):
        plan = EpochPlan([{"shard_sizes": sizes}], shuffle=True, shuffle_algo=algo, shuffle_seed=rank + 5,
                         batch_size=batch, ranks_per_node=ranks, workers_per_rank=workers,
                         shuffle_block_size=block)
        for w in range(workers):
            order = plan.shard_of(plan.worker_ids(0, rank, w))
            out.append(order[order >= 0])
    return out


@given(
    algo=st.sampled_from(["py1e", "py1s", "py1b", "py2s", "naive"]),
    readers=st.tuples(st.integers(1, 3), st.integers(1, 2)),
    batch=st.integers(1, 6),
    extra=st.integers(0, 40),
    ahead=st.integers(0, 5),
    block=st.none() | st.integers(5, 60),
    sizes_seed=st.integers(0, 1000),
)
def test_no_limit_at_or_above_the_minimum_gets_stuck_and_none_is_exceeded(
    algo: str, readers: tuple[int, int], batch: int, extra: int, ahead: int, block: int | None, sizes_seed: int
) -> None:
    orders = _world_orders(algo, readers[0], readers[1], batch, block)
    sizes = np.random.default_rng(sizes_seed).integers(50, 120, 31).tolist()
    limit = min_cache_bytes(sizes, batch, len(orders)) + extra * 10
    sim = simulate(orders, sizes, limit, batch_size=batch, predownload=batch * (1 + ahead))
    opt = offline_optimum(orders, sizes, limit, batch_size=batch)
    assert sim.peak <= limit
    assert opt.peak <= limit
    used = {int(k) for o in orders for k in o}
    assert sim.downloads >= len(used)
    assert opt.downloads >= len(used)
    # every transfer beyond the first of each shard was made room for by an eviction
    assert sim.evictions >= sim.downloads - len(used)
    assert opt.evictions >= opt.downloads - len(used)


@given(
    algo=st.sampled_from(["py1e", "py1s", "py1b", "naive"]),
    batch=st.integers(1, 5),
    slots=st.integers(0, 12),
    ahead=st.integers(0, 6),
)
def test_one_reader_equal_shards_the_policy_is_the_optimum_with_or_without_prefetch(
    algo: str, batch: int, slots: int, ahead: int
) -> None:
    """Belady is optimal for equal sizes; conservative prefetching keeps its transfer count."""
    (order,) = _world_orders(algo, 1, 1, batch, None)
    sizes = [10] * 31
    limit = min_cache_bytes(sizes, batch, 1) + 10 * slots
    opt = offline_optimum([order], sizes, limit, batch_size=batch)
    for predownload in (batch, batch * (1 + ahead)):
        assert simulate([order], sizes, limit, batch_size=batch, predownload=predownload).downloads == opt.downloads


def test_a_cache_holding_everything_downloads_each_shard_once() -> None:
    orders = _world_orders("py1e", 2, 2, 4, None)
    sizes = [100] * 31
    sim = simulate(orders, sizes, sum(sizes), batch_size=4, predownload=32)
    assert sim.downloads == len({int(k) for o in orders for k in o})
    assert sim.evictions == 0


def test_below_the_minimum_the_simulation_cannot_hold_a_step() -> None:
    orders = _world_orders("py1e", 2, 1, 4, None)
    sizes = [100] * 31
    with pytest.raises(CacheError, match="cannot hold"):
        simulate(orders, sizes, 2 * 4 * 100 - 100, batch_size=4, predownload=4)


def test_min_cache_bytes_counts_each_readers_batch_and_one_more() -> None:
    assert min_cache_bytes([5, 9, 7, 1], 2, 3) == 3 * (9 + 7) + 9
    assert min_cache_bytes([5, 9], 8, 1) == 14 + 9
    assert min_cache_bytes([], 8, 1) == 0
