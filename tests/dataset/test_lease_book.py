"""``LeaseBook`` on its own: the request order, the ``first`` mark and the releases, without I/O."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from astream._dataset.read.leases import LeaseBook


def _drive(book: LeaseBook, batch: int, n: int) -> tuple[list[tuple[int, bool]], list[int], list[tuple[int, int]]]:
    """A consumer reading ``batch`` positions at a time, granting every request at once:
    the requests (lease, first), the skipped leases, and each release with the position it came at."""
    requests: list[tuple[int, bool]] = []
    skipped: list[int] = []
    released: list[tuple[int, int]] = []
    position = 0
    while True:
        while book.due():
            if book.next_passed():
                skipped.append(book.skip())
                continue
            lease, first = book.issue()
            requests.append((lease, first))
            book.granted(lease)
        if position >= n:
            break
        position = min(n, position + batch)
        book.advance(position)
        while (lease := book.next_release()) is not None:
            released.append((lease, position))
    return requests, skipped, released


shards_st = st.lists(st.integers(0, 6), min_size=1, max_size=200).map(lambda v: np.array(v, np.int64))


@settings(max_examples=200, deadline=None)
@given(shards_st, st.integers(1, 40), st.integers(1, 16), st.booleans())
def test_every_lease_asked_for_in_start_order_and_released_once_passed(
        shards: np.ndarray, predownload: int, batch: int, bounded: bool) -> None:
    # (the reader's look-ahead is at least one read: astream._sampling.defaults.lookahead)
    book = LeaseBook(shards, max(predownload, batch), batch, bounded)
    requests, skipped, released = _drive(book, batch, len(shards))
    leases = [lease for lease, _ in requests]
    assert leases == sorted(leases)
    assert not skipped
    assert sorted(leases) == list(range(len(book)))
    assert sorted(lease for lease, _ in released) == leases  # each released once
    for lease, at in released:
        assert book.end[lease] < at  # never before the consumer passed its end
    assert not book.held
    # every position lies in a lease of its own shard
    for pos, shard in enumerate(shards.tolist()):
        assert any(book.shard[k] == shard and book.start[k] <= pos <= book.end[k] for k in range(len(book)))


@settings(max_examples=200, deadline=None)
@given(shards_st, st.integers(1, 16))
def test_bounded_asks_only_for_the_batch_about_to_be_read(shards: np.ndarray, batch: int) -> None:
    book = LeaseBook(shards, 10_000, batch, bounded=True)
    position = 0
    while not book.all_issued():
        while book.due():
            lease, first = book.issue()
            assert book.start[lease] < position + batch  # in the next batch, hence first
            assert first
            book.granted(lease)
        position = min(len(shards), position + batch)
        book.advance(position)
        while book.next_release() is not None:
            pass
        # a run per lease: no held lease spans more than its run
        for lease in book.held:
            assert (shards[book.start[lease]: book.end[lease] + 1] == book.shard[lease]).all()


def test_first_marks_what_the_next_read_needs() -> None:
    shards = np.repeat(np.arange(8, dtype=np.int64), 4)  # 8 shards of 4 positions
    book = LeaseBook(shards, 12, 4, bounded=False)
    marks = []
    while book.due():
        lease, first = book.issue()
        marks.append((lease, first))
    assert marks == [(0, True), (1, False), (2, False), (3, False)]  # starts 0, 4, 8, 12 within reach


def test_a_reader_starting_mid_way_skips_what_it_passed() -> None:
    shards = np.repeat(np.arange(4, dtype=np.int64), 10)
    book = LeaseBook(shards, 5, 5, bounded=False)
    book.advance(25)  # the first batches were handed out by a stand-in
    out = []
    while book.due():
        if book.next_passed():
            out.append(("skip", book.skip()))
        else:
            out.append(("ask", book.issue()[0]))
    assert out == [("skip", 0), ("skip", 1), ("ask", 2), ("ask", 3)]


def test_release_all_empties_the_book() -> None:
    book = LeaseBook(np.array([0, 0, 1, 1, 2], np.int64), 8, 2, bounded=False)
    while book.due():
        book.granted(book.issue()[0])
    assert book.release_all() == [0, 1, 2]
    assert not book.held
    assert book.next_release() is None
