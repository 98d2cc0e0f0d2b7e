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

__all__ = ["BLOCK", "tar_members"]

BLOCK = 512
_ZERO = bytes(BLOCK)
_REGULAR = frozenset(b"0\x007")
# Types tarfile knows and whose size field says nothing about data that follows.
_NO_DATA = frozenset(b"123456")
_PAX_RECORD = re.compile(rb"(\d+) ([^=]+)=")
_ENCODING = sys.getfilesystemencoding()
_SUM_ROWS = 8192
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
    members: list[Member] = []
    headers: list[int] = []
    pax_global: dict[str, str] = {}
    pax: dict[str, str] = {}
    long_name: str | None = None
    unpack = _HEADER.unpack_from
    pos = 0
    while pos + BLOCK <= end:
        raw_name, raw_size, kind_b, magic, raw_prefix = unpack(buf, pos)
        if raw_name[0] == 0 and buf[pos : pos + BLOCK] == _ZERO:
            break
        headers.append(pos)
        kind = kind_b[0]
        size = _number(raw_size, where)
        data = pos + BLOCK
        if kind in b"xXgLK":  # pax extended (X: Solaris) or global header; GNU long (link) name
            _fits(data, size, end, where)
            body = bytes(buf[data : data + size])
            if kind == 76:  # L
                long_name = _field(body).decode(_ENCODING, "surrogateescape")
            elif kind != 75:  # K (a link's name) means nothing here
                (pax_global if kind == 103 else pax).update(_pax(body, where))  # 103: g
            pos = data + _padded(size)
            continue
        if kind == 83:  # S
            raise ShardFormatError(f"{where}: holds a GNU sparse member (at byte {pos}); "
                                   "WebDataset tars hold plain files")
        fields = {**pax_global, **pax} if pax or pax_global else pax
        if "size" in fields:
            size = int(fields["size"])
        if kind in _NO_DATA:
            pos = data
        else:
            if data + size > end or size < 0:
                _fits(data, size, end, where)
            pos = data + -(-size // BLOCK) * BLOCK
        if kind in _REGULAR:
            name = fields.get("path") or long_name
            if name is None:
                name = raw_name.partition(b"\0")[0].decode(_ENCODING, "surrogateescape")
                if magic == b"ustar\x00" and raw_prefix[0]:
                    name = _field(raw_prefix).decode(_ENCODING, "surrogateescape") + "/" + name
            if not (kind == 0 and name.endswith("/")):  # not an old-style directory
                members.append((name, data, size))
        if fields:
            pax, long_name = {}, None
        else:
            long_name = None
    _check_sums(buf, headers, where)
    return members


def _padded(size: int) -> int:
    return -(-size // BLOCK) * BLOCK


def _fits(data: int, size: int, end: int, where: str) -> None:
    if size < 0 or data + size > end:
        raise ShardFormatError(f"{where}: not a tar file, or a truncated one (a member of {size} bytes at "
                               f"byte {data} runs past the end, {end})")


def _check_sums(buf: Buffer, headers: list[int], where: str) -> None:
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
                                   f"{headers[first + int(bad[0])]})")


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
