"""Mapping a file's pages into memory without keeping its descriptor open.

``mmap.mmap`` keeps a duplicate of the descriptor open for as long as the mapping
lives: a consumer holding many batches would run out of descriptors. Here mmap(2) is
called through ctypes, the descriptor can be closed at once, and the mapping is
unmapped when the ctypes array over it is no longer referenced (any array or view
built over it holds a reference).
"""

from __future__ import annotations

import ctypes
import mmap
import os
import sys
import weakref
from typing import Any

__all__ = ["PAGE", "MappingError", "map_file", "mapping_supported"]

PAGE = mmap.PAGESIZE


class MappingError(OSError):
    """A file could not be mapped."""


def _libc_mapping() -> tuple[Any, Any] | None:
    if not sys.platform.startswith("linux"):
        return None
    try:
        libc = ctypes.CDLL(None, use_errno=True)
        map_ = libc.mmap
        unmap = libc.munmap
    except (OSError, AttributeError):  # pragma: no cover - unusual libc
        return None
    map_.restype = ctypes.c_void_p
    map_.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
    unmap.restype = ctypes.c_int
    unmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
    return map_, unmap


_LIBC = _libc_mapping()
_MAP_FAILED = ctypes.c_void_p(-1).value


def mapping_supported() -> bool:
    """Whether :func:`map_file` works here (Linux)."""
    return _LIBC is not None


def map_file(fd: int, size: int) -> ctypes.Array[ctypes.c_ubyte]:
    """The first ``size`` bytes of file ``fd`` (rounded up to whole pages), writable and shared.

    The pages are populated at once (``MAP_POPULATE``): no page fault per page later.
    The descriptor may be closed right after; the mapping lives as long as the array.

    Raises:
        MappingError: mmap(2) failed (the message says why).
    """
    assert _LIBC is not None, "map_file needs mapping_supported()"
    map_, unmap = _LIBC
    length = max(PAGE, -(-size // PAGE) * PAGE)  # whole pages: fewer ctypes array types to cache
    flags = mmap.MAP_SHARED | getattr(mmap, "MAP_POPULATE", 0)
    addr = map_(None, length, mmap.PROT_READ | mmap.PROT_WRITE, flags, fd, 0)
    if addr is None or addr == _MAP_FAILED:
        err = ctypes.get_errno()
        raise MappingError(err, f"could not map {size} bytes of shared memory: {os.strerror(err)}")
    pages = (ctypes.c_ubyte * length).from_address(addr)
    # Unmapped once nothing refers to it; never at exit, while objects over it may still be in use.
    weakref.finalize(pages, unmap, addr, length).atexit = False
    return pages
