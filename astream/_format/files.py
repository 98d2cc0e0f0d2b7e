"""Atomic file writes: a reader sees the old file, or the complete new one, never half.

The data goes to a temporary file in the same directory, is fsynced, and is renamed
over the target; the directory is fsynced too so the rename survives a crash.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Sequence

__all__ = ["TMP_SUFFIX", "BackgroundCommit", "atomic_write", "fsync_dir", "save_rebuildable"]

TMP_SUFFIX = ".tmp"


def fsync_dir(directory: str) -> None:
    """Make the renames done in ``directory`` durable (best effort where unsupported)."""
    # Not every platform can open a directory (Windows); there the rename is what we get.
    with contextlib.suppress(OSError):
        fd = os.open(directory, os.O_RDONLY)
        try:
            os.fsync(fd)
        finally:
            os.close(fd)


def atomic_write(path: str, data: bytes | memoryview, sync_dir: bool = True, sync: bool = True) -> None:
    """Write ``data`` to ``path`` atomically (temp file + fsync + rename).

    Args:
        path: the final file name.
        data: the whole content.
        sync_dir: also fsync the directory, making the rename itself durable. A writer of
            many files can skip it per file and call :func:`sync_dir` once before the file
            that makes the others reachable (MDS: index.json).
        sync: fsync the file before the rename (without it, and without ``sync_dir``,
            readers on this machine still see the old file or the whole new one; only a
            power cut may leave it empty or torn).

    Raises:
        OSError: the disk refused; no temporary file is left behind.
    """
    # Unique per call: ranks run as threads of one process may write the same file at once.
    tmp = f"{path}.{os.getpid()}.{os.urandom(4).hex()}{TMP_SUFFIX}"
    try:
        with open(tmp, "wb") as fh:
            fh.write(data)
            fh.flush()
            if sync:
                os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(tmp)
        raise
    if sync_dir and sync:
        fsync_dir(os.path.dirname(os.path.abspath(path)))


def save_rebuildable(path: str, data: bytes) -> None:
    """Write a file that can be rebuilt from others (a cached index), creating its folder.

    Replaced whole by rename, like :func:`atomic_write`, but with no fsync at all (they
    cost milliseconds on the path to a first batch): on this machine a reader sees the old
    file or the whole new one; after a power cut it may find the old one, none, or an
    empty or torn one, and its reader rebuilds what does not parse (the cached Parquet
    footers and tar scans), or the file is written again before it is read (the
    ``index.json`` of a Parquet or WebDataset stream, rewritten by every run).
    """
    os.makedirs(os.path.dirname(path) or ".", exist_ok=True)
    atomic_write(path, data, sync_dir=False, sync=False)


class BackgroundCommit:
    """An atomic write whose slow half (fsync + rename) runs on a helper thread.

    The data is written to the temporary file at once (into the page cache, fast); the
    fsync, which waits for the disk, then overlaps with whatever the caller does next.
    :meth:`wait` joins the thread and re-raises its error. fsync releases the GIL, so the
    thread costs the caller almost nothing.
    """

    def __init__(self, path: str, pieces: Sequence[bytes | memoryview], durable: bool = True) -> None:
        self.path = path
        self._tmp = f"{path}.{os.getpid()}{TMP_SUFFIX}"
        self._error: BaseException | None = None
        self._durable = durable
        try:
            with open(self._tmp, "wb") as fh:
                fh.writelines(pieces)
        except BaseException:
            with contextlib.suppress(OSError):
                os.unlink(self._tmp)
            raise
        self._thread: threading.Thread | None = None
        if not durable:
            # A file only staged for an upload, then deleted: no fsync, which on a busy disk
            # can take longer than the upload; the rename still makes it appear whole.
            self._commit()
            return
        self._thread = threading.Thread(target=self._commit, name=f"astream-commit-{os.path.basename(path)}", daemon=True)
        self._thread.start()

    def _commit(self) -> None:
        try:
            if self._durable:
                fd = os.open(self._tmp, os.O_RDONLY)
                try:
                    os.fsync(fd)
                finally:
                    os.close(fd)
            os.replace(self._tmp, self.path)
        except BaseException as exc:  # handed to the caller's thread by wait()
            self._error = exc
            with contextlib.suppress(OSError):
                os.unlink(self._tmp)

    def wait(self) -> None:
        """Block until the file is durable and in place.

        Raises:
            OSError: the fsync or rename failed; the temporary file is gone.
        """
        if self._thread is not None:
            self._thread.join()
        if self._error is not None:
            raise self._error
