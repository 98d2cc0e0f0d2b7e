"""A mixture changed mid-epoch (issue 36): the remainder's plan, as properties (hypothesis).

Each example draws a pool of 2-5 streams, an epoch whose mixture changes 1-3 times (weights
of every kind, streams added, removed and reordered) at random positions, and a world. What
a segment delivered is read off the plan of a one-rank, one-sample-batch world (whose work
tensor is the global traversal itself), so the remainder's claims are checked against the
plans the ranks actually iterate.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st

from astream._sampling.options import PlanOptions
from astream._sampling.remainder import remainder_counts
from astream._sampling.remix import Mixture, RemainderPlan, mixed_plan, seen_before
from astream._sampling.streams import StreamSpec
from astream.errors import ConfigError

from .strategies import seeds, shard_sizes, stream_weights

SETTINGS = settings(max_examples=50, deadline=None)
ALGOS = ("py1e", "py1b", "py1s", "naive")


def _traversal(work: np.ndarray) -> np.ndarray:
    """The order the world consumes a work tensor: (batch, worker, node, rank, sample)."""
    return work.transpose(3, 2, 0, 1, 4).reshape(-1)


@dataclass
class Case:
    pool: list[np.ndarray]  # every stream's shard sizes; stream i is keyed "s{i}"
    history: list[Mixture]
    options: PlanOptions  # world 1 x 1 x 1 x 1, batch 1


@st.composite
def mixtures(draw: st.DrawFn, pool: list[np.ndarray], start: int) -> Mixture:
    chosen = draw(st.lists(st.integers(0, len(pool) - 1), min_size=1, max_size=len(pool), unique=True))
    weights, epoch_size = draw(stream_weights(len(chosen)))
    if all(w.get("repeat", w.get("choose", 1)) == 0 for w in weights) and "proportion" not in weights[0]:
        weights[0] = {next(iter(weights[0])): 1} if weights[0] else {}
    specs = tuple(StreamSpec(pool[i], **w) for i, w in zip(chosen, weights, strict=True))
    return Mixture(tuple(f"s{i}" for i in chosen), specs, epoch_size, start)


@st.composite
def cases(draw: st.DrawFn) -> Case:
    pool = [np.array(s, np.int64) for s in draw(st.lists(shard_sizes(min_total=4, max_shards=5, max_size=30),
                                                         min_size=2, max_size=5))]
    options = PlanOptions(batch_size=1, shuffle=draw(st.booleans()), shuffle_algo=draw(st.sampled_from(ALGOS)),
                          shuffle_seed=draw(seeds), num_canonical_nodes=draw(st.sampled_from([1, 2, 4, 8])),
                          shuffle_block_size=draw(st.sampled_from([4, 16, 64])), epoch=draw(st.integers(0, 3)),
                          partition_algo=draw(st.sampled_from(["orig", "relaxed"])))
    history = [draw(mixtures(pool, 0))]
    for _ in range(draw(st.integers(1, 3))):
        size = _plan(history, options, history[-1].start).epoch_size
        take = draw(st.integers(0, size))
        history.append(draw(mixtures(pool, history[-1].start + take)))
    return Case(pool, history, options)


def _plan(history: list[Mixture], options: PlanOptions, at: int, **world: int):
    try:
        plan = mixed_plan(history, options.at(sample_in_epoch=at, **world))
        _ = plan.shuffle_ids  # (a shuffle refuses a tiny epoch only when it is computed)
        return plan
    except ConfigError as exc:
        if "gets no sample" in str(exc) or "too small to partition" in str(exc):
            assume(False)  # (an epoch smaller than the canonical nodes: MosaicML refuses those too)
        raise


def _segments(case: Case) -> list[np.ndarray]:
    """What each segment delivers (the last one: all it holds), as global ids of its mixture."""
    out = []
    h = case.history
    for j in range(len(h)):
        seq = _plan(h[: j + 1], case.options, h[j].start).work().reshape(-1)
        seq = seq[seq >= 0]
        out.append(seq[: h[j + 1].start - h[j].start] if j + 1 < len(h) else seq)
    return out


def _keyed(mixture: Mixture, ids: np.ndarray) -> list[tuple[str, int]]:
    offsets = np.cumsum([0, *(s.num_samples for s in mixture.streams)])
    stream = np.searchsorted(offsets, ids, side="right") - 1
    return [(mixture.keys[s], int(i - offsets[s])) for s, i in zip(stream.tolist(), ids.tolist(), strict=True)]


@SETTINGS
@given(cases())
def test_no_sample_of_a_continuing_stream_is_delivered_twice(case: Case) -> None:
    segments = _segments(case)
    before: set[tuple[str, int]] = set()
    for mixture, ids in zip(case.history, segments, strict=True):
        keyed = _keyed(mixture, ids)
        if mixture.start:  # a later segment: nothing of what came before, nothing twice but padding
            assert not before & set(keyed)
            if len(keyed) >= case.options.resolved_ncn:
                assert len(keyed) - len(set(keyed)) < case.options.resolved_ncn  # (short canonical rows)
        before |= set(keyed)


@SETTINGS
@given(cases())
def test_the_remainder_gives_what_the_rule_says(case: Case) -> None:
    segments = _segments(case)
    last = case.history[-1]
    plan = _plan(case.history, case.options, last.start)
    assert isinstance(plan, RemainderPlan)
    seg = plan.segment
    delivered: dict[str, set[int]] = {}
    for mixture, ids in zip(case.history[:-1], segments, strict=False):
        for key, i in _keyed(mixture, ids):
            delivered.setdefault(key, set()).add(i)
    unseen = [s.num_samples - len(delivered.get(k, ())) for k, s in zip(last.keys, last.streams, strict=True)]
    assert seg.unseen.tolist() == unseen
    plain = _plan([Mixture(last.keys, last.streams, last.epoch_size)], case.options, 0)
    want = max(plain.epoch_size - last.start, 0)
    p = plain.weights.proportion
    assert seg.wanted.sum() == want
    extra = seg.wanted - np.floor(want * p)
    assert ((extra == 0) | (extra == 1)).all()
    counts = seg.counts
    assert (counts <= seg.unseen).all()
    assert counts.sum() == min(want, int(seg.unseen[p > 0].sum()))
    if (seg.wanted <= seg.unseen).all():
        assert counts.tolist() == seg.wanted.tolist()
    short = counts < seg.wanted
    assert (counts[short] == seg.unseen[short]).all()  # only a stream out of unseen samples gives less
    got: dict[str, set[int]] = {}
    for key, i in _keyed(last, segments[-1]):
        got.setdefault(key, set()).add(i)
    assert [len(got.get(k, ())) for k in last.keys] == counts.tolist()


@st.composite
def worlds(draw: st.DrawFn, ncn: int) -> dict[str, int]:
    nodes = draw(st.sampled_from([p for p in (1, 2, 4, 8) if ncn % p == 0]))
    ranks = draw(st.integers(1, 8 // nodes))
    return {"num_physical_nodes": nodes, "ranks_per_node": ranks, "workers_per_rank": draw(st.integers(1, 3)),
            "batch_size": draw(st.integers(1, 4))}


@SETTINGS
@given(cases(), st.data())
def test_the_remainder_is_the_same_on_every_world_and_resumes_exactly(case: Case, data: st.DataObject) -> None:
    last = case.history[-1]
    one = _plan(case.history, case.options, last.start).work().reshape(-1)
    world = data.draw(worlds(case.options.resolved_ncn))
    g = world["num_physical_nodes"] * world["ranks_per_node"] * world["batch_size"]
    k = data.draw(st.integers(0, len(one) // g)) * g  # a state taken on a global batch
    for at in (0, k):
        other = _traversal(_plan(case.history, case.options, last.start + at, **world).work())
        rest = one[at:]
        assert set(other[other >= 0].tolist()) == set(rest.tolist())
        for step in range(len(rest) // g):
            assert sorted(other[step * g : (step + 1) * g]) == sorted(rest[step * g : (step + 1) * g])
    again = _plan(case.history, case.options, last.start + k, **world).work()
    assert np.array_equal(again, _plan(case.history, case.options, last.start + k, **world).work())
    # What came before the change does not depend on the world: replayed once, it serves every shape.
    seen = seen_before(case.history, case.options.at(sample_in_epoch=last.start))
    reused = mixed_plan(case.history, case.options.at(sample_in_epoch=last.start + k, **world), seen).work()
    assert np.array_equal(reused, again)


@SETTINGS
@given(st.integers(0, 500), st.lists(st.floats(0, 1), min_size=1, max_size=5).filter(lambda p: sum(p) > 0),
       st.lists(st.integers(0, 200), min_size=5, max_size=5), seeds)
def test_remainder_counts_cap_and_share(total, weights, unseen, seed) -> None:
    p = np.array(weights) / sum(weights)
    have = np.array(unseen[: len(p)], np.int64)
    wanted, counts = remainder_counts(total, p, have, np.random.default_rng(seed))
    assert wanted.sum() == total
    assert (counts <= have).all()
    assert (counts >= 0).all()
    assert counts.sum() == min(total, int(have[p > 0].sum()))
    assert (wanted[p == 0] == 0).all()


def test_an_epoch_over_at_the_change_yields_nothing_more() -> None:
    spec = StreamSpec(np.array([10, 10]))
    history = [Mixture(("a",), (spec,)), Mixture(("a",), (spec,), None, 20)]
    plan = mixed_plan(history, PlanOptions(batch_size=2, sample_in_epoch=20, num_physical_nodes=1))
    assert isinstance(plan, RemainderPlan)
    assert plan.segment.size == 0
    assert plan.worker_ids(0, 0, 0).size == 0
    assert plan.rank_len == 0
    assert plan.work().size == 0


def test_a_malformed_history_is_refused() -> None:
    spec = StreamSpec(np.array([10]))
    options = PlanOptions(batch_size=1, sample_in_epoch=5)
    with pytest.raises(ConfigError, match="starts at sample 0"):
        mixed_plan([Mixture(("a",), (spec,), None, 3)], options)
    with pytest.raises(ConfigError, match="past the end of segment 0"):
        mixed_plan([Mixture(("a",), (spec,)), Mixture(("a",), (spec,), None, 11)], options.at(sample_in_epoch=11))
    with pytest.raises(ConfigError, match="random"):
        mixed_plan([Mixture(("a",), (spec,)), Mixture(("a",), (spec,), None, 2)],
                   options.at(batching_method="stratified"))
    with pytest.raises(ConfigError, match="twice"):
        Mixture(("a", "a"), (spec, spec))
