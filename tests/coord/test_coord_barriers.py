"""Barrier bookkeeping, sans I/O."""

from __future__ import annotations

import pytest

from astream._coord.barriers import Arrival, BarrierBook
from astream.errors import BarrierTimeout, CoordinationError


def test_named_parties_complete() -> None:
    book = BarrierBook()
    barrier, error = book.arrive("b", ["a", "c"], 10, Arrival(1, "a", 1), 0)
    assert error is None
    assert not barrier.complete
    assert barrier.missing() == ["c"]
    barrier, error = book.arrive("b", ["c", "a"], 10, Arrival(2, "c", 1), 1)
    assert barrier.complete
    assert error is None
    book.close(barrier)
    assert not book.open


def test_counted_parties() -> None:
    book = BarrierBook()
    barrier, _ = book.arrive("b", 3, 10, Arrival(1, "a", 1), 0)
    assert barrier.missing() == ["2 of 3 parties"]
    book.arrive("b", 3, 10, Arrival(2, "b", 1), 0)
    barrier, _ = book.arrive("b", 3, 10, Arrival(3, "c", 1), 0)
    assert barrier.complete


def test_wrong_arrivals_are_refused_alone() -> None:
    book = BarrierBook()
    book.arrive("b", ["a", "c"], 10, Arrival(1, "a", 1), 0)
    with pytest.raises(CoordinationError, match="not one of its parties"):
        book.arrive("b", ["a", "c"], 10, Arrival(2, "x", 1), 0)
    with pytest.raises(CoordinationError, match="expects parties"):
        book.arrive("b", 2, 10, Arrival(2, "c", 1), 0)
    with pytest.raises(CoordinationError, match="already waiting"):
        book.arrive("b", ["a", "c"], 10, Arrival(3, "a", 2), 0)
    assert "b" in book.open


def test_timeout_names_missing() -> None:
    book = BarrierBook()
    book.arrive("b", ["rank0.worker0", "rank1.worker0", "rank2.worker0"], 5, Arrival(1, "rank0.worker0", 1), 0)
    assert book.next_deadline() == 5
    assert book.expire(4.9) == []
    [(_barrier, error)] = book.expire(5.0)
    assert isinstance(error, BarrierTimeout)
    assert "missing rank1.worker0, rank2.worker0" in str(error)
    assert not book.open


def test_dead_party_fails_at_once() -> None:
    book = BarrierBook()
    book.arrive("b", ["a", "c"], 10, Arrival(1, "a", 1), 0)
    [(_, error)] = book.disconnected("c", clean=False, now=1)
    assert "c died" in str(error)
    assert "arrived ['a']" in str(error)
    assert not book.open
    # a later barrier naming the dead member fails on arrival...
    _barrier, error = book.arrive("b2", ["a", "c"], 10, Arrival(1, "a", 1), 2)
    assert error is not None
    assert "c died" in str(error)
    # ...until it comes back
    book.joined("c")
    _, error = book.arrive("b3", ["a", "c"], 10, Arrival(1, "a", 1), 3)
    assert error is None


def test_waiting_party_dies_in_counted_barrier() -> None:
    book = BarrierBook()
    book.arrive("b", 3, 10, Arrival(1, "a", 1), 0)
    book.arrive("b", 3, 10, Arrival(2, "x", 1), 0)
    [(barrier, error)] = book.disconnected("x", clean=False, now=1)
    assert "x died" in str(error)
    assert list(barrier.arrivals) == ["a"]


def test_clean_goodbye_does_not_fail() -> None:
    book = BarrierBook()
    book.arrive("b", 3, 10, Arrival(1, "a", 1), 0)
    book.arrive("b", 3, 10, Arrival(2, "x", 1), 0)
    assert book.disconnected("x", clean=True, now=1) == []
    assert list(book.open["b"].arrivals) == ["a"]
    assert "x" not in book.dead
