"""``ServedLedger`` and its check on their own: in-memory files, no Loader, agent or server."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import xxhash
from hypothesis import given, settings
from hypothesis import strategies as st

from astream._dataset.read.installed import check_installed
from astream._dataset.read.ledger import FROM_SOURCE, Ident, ServedLedger, check, same_bytes
from astream.errors import ServedSamplesError

INSTALLED: Ident = (1, 100)
ARRIVING: Ident = (1, 200)


class Mem:
    """A file's bytes in memory, with an identity."""

    def __init__(self, data: bytes, ident: Ident = INSTALLED, path: str = "shard.mds") -> None:
        self.data, self.ident, self.path = data, ident, path

    def read(self, first: int, stop: int) -> bytes | None:
        return self.data[first:stop] if stop <= len(self.data) else None

    def digest(self) -> int:
        return xxhash.xxh3_64_intdigest(self.data)


def _span(data: bytes, first: int, stop: int) -> tuple[int, int, int]:
    return first, stop, xxhash.xxh3_64_intdigest(data[first:stop])


files = st.binary(min_size=1, max_size=512)


@settings(max_examples=200, deadline=None)
@given(files, st.data())
def test_spans_served_from_the_installed_bytes_pass(data: bytes, draw: st.DataObject) -> None:
    ledger = ServedLedger()
    for _ in range(draw.draw(st.integers(1, 5))):
        a = draw.draw(st.integers(0, len(data) - 1))
        b = draw.draw(st.integers(a + 1, len(data)))
        source = draw.draw(st.sampled_from([None, ARRIVING]))
        ledger.note_spans(3, source, [_span(data, a, b)])
    owed = ledger.take(3)
    assert owed is not None
    assert not ledger.owes(3)
    check(owed, Mem(data), {})


@settings(max_examples=200, deadline=None)
@given(files, st.data())
def test_a_span_of_other_bytes_fails(data: bytes, draw: st.DataObject) -> None:
    a = draw.draw(st.integers(0, len(data) - 1))
    b = draw.draw(st.integers(a + 1, len(data)))
    flip = draw.draw(st.integers(a, b - 1))
    served = bytearray(data)
    served[flip] ^= 0xFF
    ledger = ServedLedger()
    ledger.note_spans(0, draw.draw(st.sampled_from([None, ARRIVING])), [_span(bytes(served), a, b)])
    owed = ledger.take(0)
    assert owed is not None
    with pytest.raises(ServedSamplesError, match=f"bytes {a}-{b} of the installed shard differ"):
        check(owed, Mem(data), {})


@settings(max_examples=100, deadline=None)
@given(files, st.booleans())
def test_unhashed_spans_compare_the_file_they_came_from(data: bytes, same: bool) -> None:
    source = data if same else bytes(b ^ 1 for b in data)
    ledger = ServedLedger()
    ledger.note_spans(0, ARRIVING, [(0, len(data), FROM_SOURCE)])
    owed = ledger.take(0)
    assert owed is not None
    assert owed.sources == {ARRIVING}
    if same:
        check(owed, Mem(data), {ARRIVING: Mem(source, ARRIVING)})
    else:
        with pytest.raises(ServedSamplesError):
            check(owed, Mem(data), {ARRIVING: Mem(source, ARRIVING)})
    with pytest.raises(ServedSamplesError):  # the file gone: nothing to compare with
        check(owed, Mem(data), {})


def test_spans_read_from_the_installed_file_itself_are_not_read_back() -> None:
    ledger = ServedLedger()
    ledger.note_spans(0, INSTALLED, [(0, 4, 12345)])  # any digest: the same inode is the same bytes
    owed = ledger.take(0)
    assert owed is not None
    check(owed, Mem(b"abcdef"), {})


@settings(max_examples=100, deadline=None)
@given(files, files)
def test_a_decoding_is_checked_against_the_whole_file(decoded: bytes, installed: bytes) -> None:
    ledger = ServedLedger()
    ledger.note_decoded(7, xxhash.xxh3_64_intdigest(decoded))
    owed = ledger.take(7)
    assert owed is not None
    assert same_bytes(xxhash.xxh3_64_intdigest(decoded), installed) == (decoded == installed)
    if decoded == installed:
        check(owed, Mem(installed), {})
    else:
        with pytest.raises(ServedSamplesError, match="shard 7: its row group, served before it was installed"):
            check(owed, Mem(installed), {})


def test_merge_forget_and_order() -> None:
    early = ServedLedger()
    early.note_decoded(5, 1)
    ledger = ServedLedger()
    ledger.note_spans(2, None, [(0, 1, 2)])
    ledger.merge(early)
    assert ledger.shards() == [2, 5]
    assert len(ledger) == 2
    ledger.forget(2)
    assert ledger.shards() == [5]
    assert ledger.take(2) is None
    owed = ledger.take(5)
    assert owed is not None
    assert owed.decoded == {1}


def test_check_installed_reads_the_file(tmp_path: Path) -> None:
    path = tmp_path / "shard.mds"
    data = os.urandom(3000)
    path.write_bytes(data)
    ledger = ServedLedger()
    ledger.note_spans(0, None, [_span(data, 10, 2000)])
    ledger.note_decoded(0, xxhash.xxh3_64_intdigest(data))
    owed = ledger.take(0)
    assert owed is not None
    check_installed(owed, str(path), {})
    path.write_bytes(data[:1500])
    with pytest.raises(ServedSamplesError):
        check_installed(owed, str(path), {})
    with pytest.raises(ServedSamplesError, match="cannot read back"):
        check_installed(owed, str(tmp_path / "gone.mds"), {})
