"""The bad-sample policy and its record, without a Loader (astream._dataset.quarantine)."""

from __future__ import annotations

import pickle

import pytest
from hypothesis import given
from hypothesis import strategies as st

from astream._dataset.quarantine import BadSample, BadSamplePolicy, QuarantineBook, Substituted
from astream.errors import (
    BadDataError,
    CompressionError,
    ConfigError,
    DownloadError,
    EncodingError,
    HashMismatchError,
    IndexFormatError,
    ServedSamplesError,
    ShardFormatError,
    StateError,
    TransformError,
    UnsafeTypeError,
)


def test_raise_is_the_default_and_refuses_skip_parameters() -> None:
    assert BadSamplePolicy.build("raise", None, None) == BadSamplePolicy()
    assert not BadSamplePolicy().skips
    for kwargs in ({"max_bad_samples": 3}, {"skip_exceptions": (ValueError,)}, {"quarantine": True}):
        args = {"max_bad_samples": None, "skip_exceptions": None, **kwargs}
        with pytest.raises(ConfigError, match="only with on_bad_sample='skip'"):
            BadSamplePolicy.build("raise", args["max_bad_samples"], args["skip_exceptions"], bool(args.get("quarantine")))


@pytest.mark.parametrize(("mode", "budget", "exceptions"), [
    ("drop", None, None), ("skip", -1, None), ("skip", 1.5, None), ("skip", 0.0, None), ("skip", True, None),
    ("skip", "10", None), ("skip", None, (42,)), ("skip", None, (KeyboardInterrupt,)),
])
def test_bad_parameters_are_config_errors(mode: str, budget: object, exceptions: object) -> None:
    with pytest.raises(ConfigError):
        BadSamplePolicy.build(mode, budget, exceptions)  # type: ignore[arg-type]


@given(st.floats(0.0001, 0.9999), st.integers(0, 10**9))
def test_a_fraction_budget_is_a_floor_of_the_epoch(fraction: float, samples: int) -> None:
    policy = BadSamplePolicy.build("skip", fraction, None)
    assert policy.budget(samples) == int(fraction * samples)


def test_what_counts_as_bad() -> None:
    policy = BadSamplePolicy.build("skip", 5, (ValueError,))
    assert policy.reason(EncodingError("x")) == "decode"
    assert policy.reason(ShardFormatError("x")) == "decode"
    assert policy.reason(CompressionError("x")) == "decode"
    assert policy.reason(HashMismatchError("x")) == "hash"
    wrapped = TransformError("t")
    wrapped.__cause__ = ValueError("odd")
    assert policy.reason(wrapped) == "transform"
    other = TransformError("t")
    other.__cause__ = KeyError("k")
    assert policy.reason(other) is None  # not listed
    for not_bad in (ServedSamplesError("x"), IndexFormatError("x"), UnsafeTypeError("x"), DownloadError("x"),
                    RuntimeError("x")):
        assert policy.reason(not_bad) is None
    assert BadSamplePolicy().reason(EncodingError("x")) is None  # raise: nothing is skipped


def _bad(i: int) -> BadSample:
    return BadSample(i, f"shard.{i // 10:05}.mds", "decode", "bad bytes")


@given(st.integers(0, 20), st.lists(st.integers(0, 1000), max_size=40))
def test_the_budget_stops_at_the_first_sample_over_it(budget: int, ids: list[int]) -> None:
    book = QuarantineBook(BadSamplePolicy.build("skip", budget, None), rank=1)
    book.begin_epoch(10_000)
    over = budget < len(ids)
    for i in ids[:budget]:
        book.met([_bad(i)])  # within the budget: recorded, never raised
    if not over:
        return
    with pytest.raises(BadDataError) as caught:
        book.met([_bad(ids[budget])])  # the first sample over it
    bad = caught.value.bad
    assert len(bad) == min(budget + 1, 10)
    assert bad[0][0] == ids[0]
    message = str(caught.value)
    assert "rank 1" in message
    assert "max_bad_samples=" in message
    assert "astream verify" in message


def test_the_state_round_trips_and_counts_only_for_its_own_rank() -> None:
    book = QuarantineBook(BadSamplePolicy.build("skip", 10, None), rank=0)
    book.begin_epoch(100)
    book.met([_bad(7), _bad(3)])
    state = book.state()
    assert state == {"ids": [3, 7], "rank": 0, "spent": 2}
    again = QuarantineBook(BadSamplePolicy.build("skip", 10, None), rank=0)
    assert again.load(pickle.loads(pickle.dumps(state))) == 2
    assert again.skipped() == {3, 7}
    other = QuarantineBook(BadSamplePolicy.build("skip", 10, None), rank=3)
    assert other.load(state) == 0
    assert other.skipped() == {3, 7}  # (known bad wherever they were met)
    with pytest.raises(StateError):
        other.load({"ids": ["x"], "rank": 0, "spent": 0})


def test_a_later_epoch_knows_the_earlier_ones_and_counts_again() -> None:
    policy = BadSamplePolicy.build("skip", 1, None).with_listed(frozenset({99}))
    book = QuarantineBook(policy, rank=0)
    book.begin_epoch(10)
    book.met([_bad(4)])
    book.begin_epoch(10)
    assert book.spent == 0
    assert book.skipped() == {4, 99}
    book.met([_bad(4)])
    with pytest.raises(BadDataError):
        book.met([_bad(4)])


def test_records_and_errors_pickle() -> None:
    sub = Substituted({"x": [1, 2]}, (_bad(1),))
    assert pickle.loads(pickle.dumps(sub)) == sub
    err = BadDataError("m", (_bad(1).as_tuple(),))
    back = pickle.loads(pickle.dumps(err))
    assert str(back) == "m"
    assert back.bad == err.bad
