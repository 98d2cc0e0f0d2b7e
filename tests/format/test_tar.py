"""astream._format.tar reads the same members as tarfile from the archives tarfile writes
(ustar, GNU and pax, long and non-ASCII names, links and directories), and refuses what is
not a complete tar."""

from __future__ import annotations

import io
import tarfile

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from astream._format.tar import BLOCK, MAX_EXTENSION, TarStream, tar_members
from astream.errors import ShardFormatError


def _archive(fmt: int, entries: list[tuple[str, bytes | None]]) -> bytes:
    """A tar of ``entries`` (a ``None`` body: a directory, then a symlink and a hard link to it)."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=fmt) as tar:
        for name, body in entries:
            if body is None:
                for kind, suffix in ((tarfile.DIRTYPE, ""), (tarfile.SYMTYPE, ".sym")):
                    info = tarfile.TarInfo(name + suffix)
                    info.type = kind
                    info.linkname = "elsewhere"
                    tar.addfile(info)
                continue
            info = tarfile.TarInfo(name)
            info.size = len(body)
            tar.addfile(info, io.BytesIO(body))
    return out.getvalue()


def _expected(data: bytes) -> list[tuple[str, int, int]]:
    with tarfile.open(fileobj=io.BytesIO(data), mode="r|") as tar:
        return [(m.name, m.offset_data, m.size) for m in tar if m.isfile()]


LONG = "deep/" * 30 + "sample.with.dots.jpg"  # 170 characters: a ustar prefix, a GNU or pax long name


@pytest.mark.parametrize("fmt", [tarfile.USTAR_FORMAT, tarfile.GNU_FORMAT, tarfile.PAX_FORMAT])
def test_same_members_as_tarfile(fmt: int) -> None:
    entries: list[tuple[str, bytes | None]] = [
        ("a/000001.cls", b"7"), ("a/000001.jpg", bytes(range(256)) * 5), ("a/empty.txt", b""),
        ("a/dir", None), (LONG, b"x" * 513), ("b/000002.seg.png", b"y" * BLOCK),
    ]
    if fmt != tarfile.USTAR_FORMAT:
        entries += [("x" * 120 + "/ünïcödé.json", b"{}"), ("n" * 150 + ".cls", b"1")]
    data = _archive(fmt, entries)
    got = tar_members(data, "t.tar")
    assert got == _expected(data)
    assert [n for n, _, _ in got if n.endswith("jpg")] == ["a/000001.jpg", LONG]
    for name, offset, size in got:
        body = dict(e for e in entries if e[1] is not None)[name]
        assert data[offset : offset + size] == body


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(st.text("abc/._-é", min_size=1, max_size=140).filter(lambda n: not n.endswith("/")),
                          st.binary(max_size=1500)), max_size=12),
       st.sampled_from([tarfile.GNU_FORMAT, tarfile.PAX_FORMAT]))
def test_any_archive_matches_tarfile(entries: list[tuple[str, bytes]], fmt: int) -> None:
    data = _archive(fmt, list(entries))
    assert tar_members(data, "t.tar") == _expected(data)


def test_a_pax_size_record_wins() -> None:
    # pax carries sizes a ustar field cannot hold; here a small one, written by hand.
    info = tarfile.TarInfo("big.bin")
    info.size = 3
    info.pax_headers = {"size": "3", "path": "renamed/by/pax.bin"}
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        tar.addfile(info, io.BytesIO(b"abc"))
    data = out.getvalue()
    assert tar_members(data, "p.tar") == _expected(data)
    assert tar_members(data, "p.tar")[0][0] == "renamed/by/pax.bin"


def test_refuses_what_is_not_a_whole_tar() -> None:
    data = _archive(tarfile.GNU_FORMAT, [("a.cls", b"1" * 700), ("b.cls", b"2" * 100)])
    with pytest.raises(ShardFormatError, match=r"t\.tar: not a tar file"):
        tar_members(b"this is not a tar archive" * 40, "t.tar")
    with pytest.raises(ShardFormatError, match="truncated"):
        tar_members(data[:BLOCK + 300], "t.tar")  # cut inside the first member
    with pytest.raises(ShardFormatError, match="truncated"):
        tar_members(data[:100], "t.tar")
    corrupt = bytearray(data)
    second = 2 * BLOCK + BLOCK  # a.cls's header, its 700 bytes padded to two blocks, then b.cls's header
    corrupt[second + 5] ^= 0x01  # a name byte: the checksum no longer matches
    with pytest.raises(ShardFormatError, match=f"bad header checksum at byte {second}"):
        tar_members(bytes(corrupt), "t.tar")
    # Cut at a member boundary, without the end blocks: the members before the cut, as tarfile reads it.
    assert tar_members(data[: 3 * BLOCK], "t.tar") == [("a.cls", BLOCK, 700)]


@pytest.mark.parametrize("layout", ["%06o\0 ", "%07o\0", " %05o\0 ", "%o\0", "signed"])
def test_checksum_fields_as_writers_spell_them(layout: str) -> None:
    data = bytearray(_archive(tarfile.GNU_FORMAT, [("é.cls", b"1"), ("b.cls", b"2")]))  # a byte >= 0x80
    head = data[:BLOCK]
    head[148:156] = b" " * 8
    if layout == "signed":  # old Sun and NeXT tars summed signed bytes
        total = sum(b - 256 if b > 127 else b for b in head)
        layout = "%06o\0 "
    else:
        total = sum(head)
    field = (layout % total).encode()
    data[148:156] = field.ljust(8, b"\0")
    assert tar_members(bytes(data), "t.tar") == [("é.cls", BLOCK, 1), ("b.cls", 3 * BLOCK, 1)]
    data[0] ^= 0x01  # the name changes, the checksum does not match any more
    with pytest.raises(ShardFormatError, match="bad header checksum at byte 0"):
        tar_members(bytes(data), "t.tar")


def _streamed(data: bytes, step: int) -> list[tuple[str, int, int]]:
    stream = TarStream("t.tar")
    for at in range(0, len(data), step):
        stream.feed(data[at : at + step])
    return stream.members()


@settings(max_examples=25, deadline=None)
@given(st.lists(st.tuples(st.text("abc/._-é", min_size=1, max_size=140).filter(lambda n: not n.endswith("/")),
                          st.binary(max_size=1500)), max_size=12),
       st.sampled_from([tarfile.GNU_FORMAT, tarfile.PAX_FORMAT]), st.integers(1, 3000))
def test_a_stream_in_any_windows_reads_the_same(entries: list[tuple[str, bytes]], fmt: int, step: int) -> None:
    data = _archive(fmt, list(entries))
    assert _streamed(data, step) == tar_members(data, "t.tar")


def test_a_stream_refuses_what_the_buffer_refuses() -> None:
    data = _archive(tarfile.PAX_FORMAT, [(LONG, b"1" * 700), ("b.cls", b"2" * 100)])
    for cut in (100, BLOCK + 100, 3 * BLOCK + 50):  # in a header, in the pax body, in a member
        with pytest.raises(ShardFormatError, match="truncated"):
            _streamed(data[:cut], 64)
        with pytest.raises(ShardFormatError, match="truncated"):
            tar_members(data[:cut], "t.tar")


def _pax_member(records: dict[str, str], body: bytes = b"abc") -> bytes:
    info = tarfile.TarInfo("m.bin")
    info.size = len(body)
    info.pax_headers = records
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w", format=tarfile.PAX_FORMAT) as tar:
        tar.addfile(info, io.BytesIO(body))
    return out.getvalue()


@pytest.mark.parametrize("size", ["12abc", "-3", " 3", "0x10", "³"])
def test_a_pax_size_that_is_not_a_number(size: str) -> None:
    data = _pax_member({"size": size})
    with pytest.raises(ShardFormatError, match=r"t\.tar: a pax header's size record is .*not a decimal number"):
        tar_members(data, "t.tar")
    with pytest.raises(ShardFormatError, match="not a decimal number"):
        _streamed(data, 100)


def test_an_extension_header_is_bounded() -> None:
    data = _pax_member({"comment": "x" * (MAX_EXTENSION + 10)})
    with pytest.raises(ShardFormatError, match=r"a tar extension header of \d+ bytes at byte 0"):
        _streamed(data, 4096)
