"""The I/O of the served-bytes check: files read by ``pread``, for :func:`~astream._dataset.read.ledger.check`.

Blocking (the reader runs :func:`check_installed` in a thread); nothing here writes or
decides: the ledger decides what to compare, this module only reads.
"""

from __future__ import annotations

import os
from collections.abc import Mapping

import xxhash

from astream._dataset.read.ledger import Ident, Owed, check
from astream.errors import ServedSamplesError

__all__ = ["FileBytes", "check_installed", "pread"]


def pread(fd: int, offset: int, count: int) -> bytes | None:
    """``count`` bytes at ``offset``, or None if the file ends first."""
    parts: list[bytes] = []
    got = 0
    while got < count:
        data = os.pread(fd, count - got, offset + got)
        if not data:
            return None
        parts.append(data)
        got += len(data)
    return parts[0] if len(parts) == 1 else b"".join(parts)


class FileBytes:
    """An open file's bytes (its descriptor stays the caller's)."""

    def __init__(self, fd: int, path: str = "", ident: Ident | None = None) -> None:
        self.fd = fd
        self.path = path
        if ident is None:
            st = os.fstat(fd)
            ident = (st.st_dev, st.st_ino)
        self.ident: Ident = ident

    def read(self, first: int, stop: int) -> bytes | None:
        return pread(self.fd, first, stop - first)

    def digest(self) -> int:
        hasher = xxhash.xxh3_64()
        offset = 0
        while chunk := os.pread(self.fd, 1 << 22, offset):
            hasher.update(chunk)
            offset += len(chunk)
        return hasher.intdigest()


def check_installed(owed: Owed, path: str, sources: Mapping[Ident, int]) -> None:
    """:func:`~astream._dataset.read.ledger.check` of ``owed`` against the installed file at
    ``path`` (``sources``: descriptors of the files spans were read from, still open).

    Raises:
        ServedSamplesError: a difference, or an installed file that cannot be read back.
    """
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError as exc:
        raise ServedSamplesError(
            f"{path}: cannot read back the shard whose samples were served while it arrived ({exc}); "
            "those samples are unchecked: restart the epoch from its last state"
        ) from exc
    try:
        check(owed, FileBytes(fd, path), {ident: FileBytes(f, ident=ident) for ident, f in sources.items()})
    finally:
        os.close(fd)
