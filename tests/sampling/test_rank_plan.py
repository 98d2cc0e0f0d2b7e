"""A rank's plan computed from its own share is exactly its slice of the world's plan."""

from __future__ import annotations

import numpy as np
from hypothesis import assume, given, reject, settings
from hypothesis import strategies as st

from astream._sampling.shuffle.draws import jitter_draws, supported
from astream.errors import ConfigError
from astream.sampling import SHUFFLE_ALGOS, EpochPlan

from .strategies import seeds, shard_sizes

SLOW = settings(max_examples=150, deadline=None)


@st.composite
def settings_and_world(draw: st.DrawFn) -> tuple[list[dict[str, object]], dict[str, object]]:
    """Streams (one, or weighted ones) and every knob a plan takes, over a world that fits."""
    weighted = draw(st.booleans())
    count = draw(st.integers(2, 3)) if weighted else 1
    streams: list[dict[str, object]] = []
    for _ in range(count):
        stream: dict[str, object] = {"shard_sizes": draw(shard_sizes(min_total=12, max_shards=10, max_size=50))}
        if weighted:
            stream["proportion"] = draw(st.sampled_from([0.2, 0.5, 1.0, 1.7]))
        streams.append(stream)
    ncn = draw(st.sampled_from([1, 2, 3, 4, 6, 8]))
    nodes = draw(st.sampled_from([p for p in range(1, ncn + 1) if ncn % p == 0] + [2 * ncn]))
    knobs: dict[str, object] = {
        "shuffle": draw(st.sampled_from([True, True, True, False])),
        "shuffle_algo": draw(st.sampled_from(SHUFFLE_ALGOS)),
        "shuffle_seed": draw(seeds),
        "num_canonical_nodes": ncn,
        # 4..: py1e's jitter bounds are wide enough to be replayed by arithmetic; 2 is not.
        "shuffle_block_size": draw(st.sampled_from([2, 5, 16, 64, 1 << 18])),
        "partition_algo": draw(st.sampled_from(["orig", "relaxed"])),
        "batch_size": draw(st.integers(1, 5)),
        "num_physical_nodes": nodes,
        "ranks_per_node": draw(st.integers(1, 3)),
        "workers_per_rank": draw(st.integers(1, 3)),
        "epoch": draw(st.integers(0, 4)),
    }
    if weighted:
        knobs["epoch_size"] = draw(st.integers(30, 150))
    return streams, knobs


def _world_plan(streams, knobs, **extra) -> EpochPlan:
    try:
        return EpochPlan(streams, **knobs, **extra)
    except ConfigError as exc:
        # Worlds MosaicML cannot lay out (too few samples for the nodes, a canonical node
        # with none for py1e, a resume past the end) are refused by both: not the property.
        if any(s in str(exc) for s in ("too small", "gets no sample", "beyond the end")):
            reject()
        raise


@SLOW
@given(settings_and_world(), st.data())
def test_each_ranks_own_plan_is_its_slice_of_the_worlds(case, data) -> None:
    streams, knobs = case
    whole = _world_plan(streams, knobs)
    epoch_size = whole.epoch_size
    world = knobs["num_physical_nodes"] * knobs["ranks_per_node"]
    assume(epoch_size >= knobs["num_canonical_nodes"])
    resume = data.draw(st.integers(0, epoch_size)) // world * world  # checkpoints fall on global steps
    resumed = _world_plan(streams, knobs, sample_in_epoch=resume)
    expected = resumed.work()
    shared: dict[int, dict[str, object]] = {}  # generator states other ranks found, as a node shares them
    order = [(n, r) for n in range(knobs["num_physical_nodes"]) for r in range(knobs["ranks_per_node"])]
    for node, rank in data.draw(st.permutations(order)):
        # A fresh plan per rank: nothing computed for another rank is reused.
        alone = _world_plan(streams, knobs, sample_in_epoch=resume)
        got = alone.rank_ids(node, rank)
        assert got.shape == expected[node, rank].shape
        assert np.array_equal(got, expected[node, rank]), (node, rank)
        worker = data.draw(st.integers(0, knobs["workers_per_rank"] - 1))
        assert np.array_equal(alone.worker_ids(node, rank, worker), expected[node, rank, worker].reshape(-1))
        # The same rank started from the states the ranks before it left: the same ids.
        helped = _world_plan(streams, knobs, sample_in_epoch=resume)
        assert helped.shuffle_key == alone.shuffle_key
        helped.node_states = dict(shared)
        assert np.array_equal(helped.rank_ids(node, rank), expected[node, rank]), ("helped", node, rank)
        shared.update(alone.node_states)


@settings(max_examples=200, deadline=None)
@given(seeds, st.lists(st.integers(0, 3000), max_size=40), st.sampled_from([
    (375, 625), (3, 5), (0, (1 << 31) + 2), (7, (1 << 32) - 1), (1 << 20, (1 << 21) + 12345)]),
    st.integers(0, 5))
def test_the_jitter_draws_replayed_by_arithmetic_leave_the_generator_as_real_draws_do(seed, sizes, bounds,
                                                                                      before) -> None:
    """Including bounds that reject about half the first draws, and a half-used 64-bit draw."""
    assert supported()
    low, high = bounds
    real, replayed = np.random.default_rng(seed), np.random.default_rng(seed)
    for rng in (real, replayed):
        rng.integers(0, 3, before)  # 32-bit draws: leaves the generator's buffered half set or not
    for size in sizes:
        real.integers(low, high)
        real.uniform(-2.0, 3.0, size)
    assert jitter_draws(replayed, sizes, low, high)
    assert real.bit_generator.state == replayed.bit_generator.state
    assert real.integers(0, 1 << 62) == replayed.integers(0, 1 << 62)


def test_bounds_the_arithmetic_does_not_model_are_left_to_the_real_draws() -> None:
    rng = np.random.default_rng(1)
    state = rng.bit_generator.state
    for low, high in ((5, 6), (5, 5), (0, 1 << 33)):  # no draw at all, an error, a 64-bit draw
        assert not jitter_draws(rng, [3, 4], low, high)
    assert rng.bit_generator.state == state
    other = np.random.Generator(np.random.MT19937(1))
    assert not jitter_draws(other, [3], 375, 625)
