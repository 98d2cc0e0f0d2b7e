"""What a remote's answer must be: its size, the range asked, the body and range it sent.

Apart from :mod:`astream._storage.base` because these checks are one job every backend
shares after an attempt (is this the object index.json describes, are these the bytes
asked for?), separate from the protocol and the retry loop. Each failure says whether
another attempt may fix it: a short body is :class:`~astream._storage.retry.Transient`
(retried), a wrong size or range a :class:`~astream.errors.DownloadError` (the same
request would get the same answer).
"""

from __future__ import annotations

import operator
import re

from astream._storage.retry import Transient
from astream.errors import ConfigError, DownloadError, SizeMismatchError

__all__ = [
    "CONTENT_RANGE",
    "check_body_length",
    "check_content_range",
    "check_range",
    "check_remote_size",
    "range_past_end",
]


def check_remote_size(url: str, total: int, size: int | None) -> None:
    """Refuse a remote object whose size differs from what index.json recorded.

    Raises:
        SizeMismatchError: the sizes differ (the dataset changed after its index was written).
    """
    if size is not None and total != size:
        raise SizeMismatchError(f"{url}: the remote object is {total} bytes but index.json says {size}; "
                                "the dataset changed after its index was written (re-create the index or the cache)")


def check_range(url: str, start: int, end: int) -> tuple[int, int]:
    """Refuse a byte range that is not ``0 <= start <= end``; returns it as plain ints.

    Integer-likes (numpy offsets read from an index) are accepted through ``__index__``.

    Raises:
        ConfigError: a bound is not an integer, ``start < 0`` or ``end < start``.
    """
    bounds = []
    for name, value in (("start", start), ("end", end)):
        try:
            if isinstance(value, bool):
                raise TypeError
            bounds.append(operator.index(value))
        except TypeError:
            raise ConfigError(f"{url}: read_range {name} must be an integer, got {value!r}") from None
    first, stop = bounds
    if first < 0 or stop < first:
        raise ConfigError(f"{url}: read_range needs 0 <= start <= end, got start={first}, end={stop}")
    return first, stop


def check_body_length(url: str, data: bytes, start: int, length: int) -> bytes:
    """``data`` if it is the ``length`` bytes a ranged read at ``start`` asked for.

    Raises:
        Transient: the body came short (the connection ended early: retried).
        DownloadError: the body is longer than asked (the same request would get the same).
    """
    if len(data) < length:
        raise Transient(f"the body ended after {len(data)} of {length} bytes")
    if len(data) > length:
        raise DownloadError(f"{url}: asked for {length} bytes at {start} but got {len(data)}; not retried")
    return data


def range_past_end(url: str, size: int | None, start: int, end: int) -> DownloadError:
    """The error for a range that runs past the end of the object (``size`` if known)."""
    what = f"is {size} bytes" if size is not None else "ends"
    return DownloadError(
        f"{url}: the object {what} before byte {end}, so it has no bytes {start}:{end} "
        "(the index and the remote disagree, or the object changed)"
    )


# "bytes first-last/total" (total "*" when unknown); HTTP resumes and ranged reads parse it.
CONTENT_RANGE = re.compile(r"^\s*bytes\s+(\d+)-(\d+)/(\d+|\*)\s*$")


def check_content_range(url: str, header: str | None, start: int, end: int) -> None:
    """Refuse a partial answer that is not exactly bytes ``start:end`` (``end`` exclusive).

    Raises:
        DownloadError: the object is shorter than ``end`` (the server clamped the range),
            or the server says it sent other bytes than asked. Not retried: the same
            request would get the same answer.
    """
    match = CONTENT_RANGE.match(header or "")
    if match and int(match.group(1)) == start and int(match.group(2)) == end - 1:
        return
    if match and int(match.group(1)) == start and match.group(3) != "*" and int(match.group(3)) < end:
        raise range_past_end(url, int(match.group(3)), start, end)
    raise DownloadError(
        f"{url}: asked for bytes {start}-{end - 1} but the answer's Content-Range is {header!r}; not retried"
    )
