"""The members of a tar archive, read from its headers in one pass over a buffer.

``tarfile`` builds a ``TarInfo`` object (a dozen decoded fields) per member and reads
through a file object; a WebDataset tar holds thousands of small members, so that costs
~20 µs each, more than reading the member itself. Here a header is looked at only for
what locating a member's data needs (name, size, type, and the GNU and pax extensions
that change them), and the checksums of all headers are checked at once with NumPy.

What counts as a member follows ``tarfile``: regular files (types ``0``, ``\\0``, ``7``),
names extended by a ustar prefix, a GNU long name (``L``) or a pax ``path`` record, sizes
by a pax ``size`` record or GNU base-256; directories, links and devices are skipped;
unknown types are skipped with their data; the archive ends at the first zero block or
at the end of the buffer. Unlike ``tarfile``, which stops quietly at a bad header after
the first one, any header whose checksum is wrong is an error, as is a member whose data
runs past the end: a tar cut short never passes for a smaller one.
"""

from __future__ import annotations

import mmap
import re
import struct
import sys

import numpy as np

from astream.errors import ShardFormatError

__all__ = ["BLOCK", "MAX_EXTENSION", "TarStream", "tar_members"]

BLOCK = 512
_ZERO = bytes(BLOCK)
_REGULAR = frozenset(b"0\x007")
# Types tarfile knows and whose size field says nothing about data that follows.
_NO_DATA = frozenset(b"123456")
_PAX_RECORD = re.compile(rb"(\d+) ([^=]+)=")
_ENCODING = sys.getfilesystemencoding()
_SUM_ROWS = 8192
# The largest pax or GNU long-name header read: real ones hold a few names and numbers;
# a stream keeps one whole until its member, so it must be bounded.
MAX_EXTENSION = 1 << 20
_OCTAL = 8 ** np.arange(7, -1, -1, dtype=np.int64)  # 8**7 .. 8**0
# name, size, type, magic, prefix (the fields a member's place depends on; the checksums
# are read with all the headers at once)
_HEADER = struct.Struct("100s24x12s20xc100x6s2x64x16x155s12x")
assert _HEADER.size == BLOCK

Buffer = bytes | bytearray | memoryview | mmap.mmap
Member = tuple[str, int, int]  # (name, offset of its data, size)


def _field(raw: bytes) -> bytes:
    return raw.partition(b"\0")[0]


def _number(raw: bytes, where: str) -> int:
    if raw[0] in (0o200, 0o377):  # GNU base-256
        n = int.from_bytes(raw[1:], "big")
        return n - (256 ** (len(raw) - 1)) if raw[0] == 0o377 else n
    try:
        return int(raw.partition(b"\0")[0] or b"0", 8)  # int() ignores the padding spaces
    except ValueError:
        raise ShardFormatError(f"{where}: not a tar file, or a corrupt one (a header's number field "
                               f"is {raw!r})") from None


def _pax(data: bytes, where: str) -> dict[str, str]:
    """The records of a pax header (``"<len> <key>=<value>\\n"``), decoded as UTF-8."""
    out: dict[str, str] = {}
    pos = 0
    while (match := _PAX_RECORD.match(data, pos)) is not None:
        length = int(match.group(1))
        if length <= 0:
            raise ShardFormatError(f"{where}: a corrupt pax header (record length {length})")
        value = data[match.end() : match.start() + length - 1]
        out[match.group(2).decode("utf-8", "surrogateescape")] = value.decode("utf-8", "surrogateescape")
        pos = match.start() + length
    return out


class TarWalk:
    """What one pass over a tar's headers has found so far: its members, and the extension
    headers (pax, GNU long names) that apply to the next one.

    :meth:`walk` reads the headers lying wholly inside a buffer; :func:`tar_members` calls
    it once on a whole archive, :class:`TarStream` once per window of a stream, so both
    read a tar by the same rules.
    """

    def __init__(self, where: str) -> None:
        self.where = where
        self.members: list[Member] = []
        self.ended = False  # the zero block that ends the archive was read
        self.last: tuple[int, int] = (0, 0)  # (archive offset, size) of the last member's data
        self._pax_global: dict[str, str] = {}
        self._pax: dict[str, str] = {}
        self._long_name: str | None = None

    def walk(self, buf: Buffer, base: int, end: int) -> int:
        """Read the headers in ``buf[:end]`` (``buf[0]`` is byte ``base`` of the archive).

        Returns:
            Where the next header starts: past ``end`` when a member's data runs on past
            it, or the offset of an extension header whose body is not wholly in ``buf``.
        """
        where = self.where
        members = self.members
        headers: list[int] = []
        unpack = _HEADER.unpack_from
        pos = 0
        while pos + BLOCK <= end:
            raw_name, raw_size, kind_b, magic, raw_prefix = unpack(buf, pos)
            if raw_name[0] == 0 and buf[pos : pos + BLOCK] == _ZERO:
                self.ended = True
                break
            kind = kind_b[0]
            size = _number(raw_size, where)
            data = pos + BLOCK
            if kind in b"xXgLK":  # pax extended (X: Solaris) or global header; GNU long (link) name
                if not 0 <= size <= MAX_EXTENSION:
                    raise ShardFormatError(f"{where}: a tar extension header of {size} bytes at byte {base + pos} "
                                           f"(at most {MAX_EXTENSION}); not a tar, or a hostile one")
                if data + size > end:
                    break  # its body is in the next window (or past the end: the caller says)
                headers.append(pos)
                body = bytes(buf[data : data + size])
                if kind == 76:  # L
                    self._long_name = _field(body).decode(_ENCODING, "surrogateescape")
                elif kind != 75:  # K (a link's name) means nothing here
                    (self._pax_global if kind == 103 else self._pax).update(_pax(body, where))  # 103: g
                pos = data + _padded(size)
                continue
            headers.append(pos)
            if kind == 83:  # S
                raise ShardFormatError(f"{where}: holds a GNU sparse member (at byte {base + pos}); "
                                       "WebDataset tars hold plain files")
            pax = self._pax
            fields = {**self._pax_global, **pax} if pax or self._pax_global else pax
            if "size" in fields:
                size = _pax_size(fields["size"], where)
            if kind in _NO_DATA:
                pos = data
            else:
                if size < 0:
                    raise _past_end(base + data, size, base + end, where)
                self.last = (base + data, size)
                pos = data + -(-size // BLOCK) * BLOCK
            if kind in _REGULAR:
                name = fields.get("path") or self._long_name
                if name is None:
                    name = raw_name.partition(b"\0")[0].decode(_ENCODING, "surrogateescape")
                    if magic == b"ustar\x00" and raw_prefix[0]:
                        name = _field(raw_prefix).decode(_ENCODING, "surrogateescape") + "/" + name
                if not (kind == 0 and name.endswith("/")):  # not an old-style directory
                    members.append((name, base + data, size))
            if fields:
                self._pax = {}
            self._long_name = None
        _check_sums(buf, headers, where, base)
        return pos

    def check_end(self, pending: int, total: int) -> None:
        """At the end of the archive (``total`` bytes, ``pending`` of them not yet walked):
        a member or an extension that runs past it is an error, not a shorter tar."""
        if self.ended:
            return
        at, size = self.last
        if at + size > total:
            raise _past_end(at, size, total, self.where)
        if pending >= BLOCK:
            raise ShardFormatError(f"{self.where}: not a tar file, or a truncated one (an extension header's "
                                   f"body runs past the end, {total})")


def tar_members(buf: Buffer, where: str) -> list[Member]:
    """The regular files of the tar in ``buf``: name, offset of the data, size, in order.

    Args:
        buf: the whole (uncompressed) archive.
        where: the file or URL, for messages.

    Raises:
        ShardFormatError: not a tar, a corrupt header, or a member cut short.
    """
    end = len(buf)
    if end < BLOCK:
        raise ShardFormatError(f"{where}: not a tar file, or a truncated one ({end} bytes)")
    walk = TarWalk(where)
    pos = walk.walk(buf, 0, end)
    walk.check_end(max(end - pos, 0), end)
    return walk.members


class TarStream:
    """The members of a tar that arrives in windows (a gzip stream decoded step by step).

    Only headers are kept: member data is skipped as it passes, so a member of any size
    costs no memory (an extension header at most :data:`MAX_EXTENSION`).
    """

    def __init__(self, where: str) -> None:
        self._walk = TarWalk(where)
        self._pending = bytearray()
        self._base = 0  # archive offset of the first pending byte
        self._skip = 0  # bytes of member data still to pass before the next header
        self.total = 0  # bytes fed so far: the archive's size once it ended

    def feed(self, window: bytes | bytearray | memoryview) -> None:
        """The next bytes of the archive."""
        self.total += len(window)
        view = memoryview(window)
        if self._skip:
            n = min(self._skip, len(view))
            self._skip -= n
            self._base += n
            view = view[n:]
        if not view or self._walk.ended:
            return
        pending = self._pending
        pending += view
        pos = self._walk.walk(pending, self._base, len(pending))
        if pos >= len(pending):
            self._skip = pos - len(pending)
            self._base += len(pending)
            pending.clear()
        else:
            del pending[:pos]
            self._base += pos

    def members(self) -> list[Member]:
        """At the end of the stream: the members (offsets in the uncompressed archive).

        Raises:
            ShardFormatError: not a tar, a corrupt header, or a member cut short.
        """
        if self.total < BLOCK:
            raise ShardFormatError(f"{self._walk.where}: not a tar file, or a truncated one ({self.total} bytes)")
        self._walk.check_end(len(self._pending), self.total)
        return self._walk.members


def _pax_size(value: str, where: str) -> int:
    if not value.isascii() or not value.isdigit():
        raise ShardFormatError(f"{where}: a pax header's size record is {value!r}, not a decimal number; "
                               "not a tar, or a corrupt one")
    return int(value)


def _past_end(data: int, size: int, end: int, where: str) -> ShardFormatError:
    return ShardFormatError(f"{where}: not a tar file, or a truncated one (a member of {size} bytes at "
                            f"byte {data} runs past the end, {end})")


def _padded(size: int) -> int:
    return -(-size // BLOCK) * BLOCK


def _check_sums(buf: Buffer, headers: list[int], where: str, base: int = 0) -> None:
    """Every header's checksum (unsigned or signed: tars write either), all at once."""
    if not headers:
        return
    whole = np.frombuffer(buf, np.uint8)
    span = np.arange(BLOCK, dtype=np.int64)
    for first in range(0, len(headers), _SUM_ROWS):  # a few MB of header copies at a time
        at = np.asarray(headers[first : first + _SUM_ROWS], np.int64)
        blocks = whole[at[:, None] + span]  # a copy (fancy index)
        stored = _stored_sums(blocks[:, 148:156], where)
        blocks[:, 148:156] = ord(" ")
        bad = np.flatnonzero(blocks.sum(axis=1, dtype=np.int64) != stored)
        if bad.size:  # a writer that summed signed bytes (old Sun and NeXT tars)
            signed = blocks[bad].view(np.int8).sum(axis=1, dtype=np.int64)
            bad = bad[signed != stored[bad]]
        if bad.size:
            raise ShardFormatError(f"{where}: not a tar file, or a corrupt one (bad header checksum at byte "
                                   f"{base + headers[first + int(bad[0])]})")


def _stored_sums(fields: np.ndarray, where: str) -> np.ndarray:
    """The checksum fields as numbers: the two layouts writers use ("%06o\\0 ", "%07o\\0")
    read at once, any other one by one."""
    digits = (fields >= ord("0")) & (fields <= ord("7"))
    six = digits[:, :6].all(axis=1) & (fields[:, 6] == 0) & (fields[:, 7] == ord(" "))
    seven = digits[:, :7].all(axis=1) & (fields[:, 7] == 0)
    values = fields.astype(np.int64) - ord("0")
    out = np.where(six, values[:, :6] @ _OCTAL[2:], values[:, :7] @ _OCTAL[1:])
    for row in np.flatnonzero(~(six | seven)):
        out[row] = _number(bytes(fields[row]), where)
    return out
