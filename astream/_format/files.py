"""Atomic file writes: a reader sees the old file, or the complete new one, never half.

The data goes to a temporary file in the same directory, is fsynced, and is renamed
over the target; the directory is fsynced too so the rename survives a crash.
"""

from __future__ import annotations

import contextlib
import os

__all__ = ["TMP_SUFFIX", "atomic_write"]

TMP_SUFFIX = ".tmp"


def _fsync_dir(directory: str) -> None:
    # Not every platform can open a directory (Windows); there the rename is what we get.
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def atomic_write(path: str, data: bytes | memoryview) -> None:
    """Write ``data`` to ``path`` atomically (temp file + fsync + rename).

    Raises:
        OSError: the disk refused; no temporary file is left behind.
    """
    tmp = f"{path}.{os.getpid()}{TMP_SUFFIX}"
    try:
        with open(tmp, "wb") as fh:
            fh.write(data)
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    _fsync_dir(os.path.dirname(os.path.abspath(path)))
