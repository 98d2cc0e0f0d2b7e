"""Turning a stream of remote bytes into a shard file in the cache, off the event loop.

:class:`ShardSink` receives the stored (usually compressed) bytes of one shard file
and, in a worker thread, hashes them, decompresses them and writes the raw file to a
temporary name beside its final one (and the compressed file too, with ``keep_zip``).
:meth:`ShardSink.finish` checks the digest and the raw size, fsyncs, and renames: the
final name appears only for a complete, valid file. Anything else removes the
temporaries (:meth:`~astream._storage.sink.BufferedSink.abort`).

Temporary names carry the writer's pid (``<final>.<pid>.<hex>.tmp``), so a later run
can tell the leftovers of a crashed process (:func:`remove_stale_temporaries`).
"""

from __future__ import annotations

import contextlib
import errno
import os
import re
from collections.abc import Iterator
from concurrent.futures import Executor
from typing import BinaryIO

from astream._cache.cache import ShardCache, ShardFile
from astream._cache.durability import BackgroundSync, pid_alive
from astream._format.compression import Codec, StreamDecoder
from astream._format.hashing import Hasher, new_hasher
from astream._storage.sink import BufferedSink, datasync, fsync_dir
from astream.errors import CacheError, CompressionError

__all__ = [
    "CorruptFile", "ShardSink", "find_temporaries", "find_temporary", "remove_stale_temporaries", "still_written",
    "temp_name", "verify_files",
]

_TEMP = re.compile(r"\.(\d+)\.[0-9a-f]{8}\.tmp$")
_DISK_ERRNOS = {errno.ENOSPC, errno.EDQUOT, errno.EFBIG, errno.EROFS}


class CorruptFile(Exception):
    """The bytes received do not match index.json (digest, size, or compression)."""

    def __init__(self, message: str, *, hash_mismatch: bool = False) -> None:
        super().__init__(message)
        self.hash_mismatch = hash_mismatch


def temp_name(final: str) -> str:
    """A temporary path beside ``final`` that names this process."""
    return f"{final}.{os.getpid()}.{os.urandom(4).hex()}.tmp"


def find_temporary(final: str) -> str | None:
    """The temporary file a live process is writing ``final`` to, or None.

    Readers on the node use it to read a shard while it arrives (the file grows in order:
    every byte below its size is written). A crashed writer's leftover is never chosen.
    If several live writers exist (they should not: one download per shard per node), the
    newest is taken.
    """
    folder, base = os.path.split(final)
    best: tuple[float, str] | None = None
    with contextlib.suppress(OSError), os.scandir(folder or ".") as it:
        for entry in it:
            name = entry.name
            if not name.startswith(base) or len(name) == len(base) or name[len(base)] != ".":
                continue
            match = _TEMP.fullmatch(name[len(base):])
            if match and pid_alive(int(match.group(1))):
                with contextlib.suppress(OSError):
                    stamp = entry.stat().st_mtime
                    if best is None or stamp > best[0]:
                        best = (stamp, entry.path)
    return None if best is None else best[1]


def still_written(temporary: str, ident: tuple[int, int]) -> bool:
    """Whether ``temporary`` (found by :func:`find_temporary`) is still the file ``ident``
    (device, inode) a reader opened: False once it was renamed into place or given up."""
    try:
        st = os.stat(temporary)
    except FileNotFoundError:
        return False
    return (st.st_dev, st.st_ino) == ident


def _files(folder: str, depth: int, max_depth: int) -> Iterator[os.DirEntry[str]]:
    with contextlib.suppress(OSError), os.scandir(folder) as it:
        for entry in it:
            if entry.is_dir(follow_symlinks=False) and depth < max_depth:
                yield from _files(entry.path, depth + 1, max_depth)
            elif entry.is_file(follow_symlinks=False):
                yield entry


def find_temporaries(root: str, max_depth: int = 2) -> list[tuple[str, int, int]]:
    """``(path, writer pid, bytes)`` of every ``*.<pid>.<hex>.tmp`` file under ``root`` (reads only)."""
    found = []
    for entry in _files(root, 1, max_depth):
        match = _TEMP.search(entry.name)
        if match:
            with contextlib.suppress(OSError):
                found.append((entry.path, int(match.group(1)), entry.stat(follow_symlinks=False).st_size))
    return found


def remove_stale_temporaries(root: str, max_depth: int = 2) -> list[str]:
    """Delete ``*.<pid>.<hex>.tmp`` files under ``root`` whose process is gone.

    Returns:
        The paths removed.
    """
    removed: list[str] = []
    for entry in _files(root, 1, max_depth):
        match = _TEMP.search(entry.name)
        if match and not pid_alive(int(match.group(1))):
            with contextlib.suppress(OSError):
                os.unlink(entry.path)
                removed.append(entry.path)
    return removed


class ShardSink(BufferedSink):
    """Hash + decompress + write one shard file as its bytes arrive.

    Args:
        raw_path: the final path of the decompressed file.
        raw_size: its size according to index.json.
        codec: the codec of the stored bytes, or None if they are stored raw.
        zip_path: also keep the stored bytes at this path (``keep_zip``), or None.
        hash_algo: validate the stored bytes with this algorithm, or None.
        digest: the expected hex digest for ``hash_algo``.
        name: the URL or path, for messages.
        executor: where the work runs.
        fsync: fsync files before renaming them.
        priority: the executor runs lower numbers first (the prefetcher's plan order).
        syncer: fsync files on this helper *after* renaming them instead (with ``fsync``);
            the caller awaits ``syncer.prepare()`` before :meth:`finish`.
    """

    def __init__(
        self,
        raw_path: str,
        raw_size: int,
        *,
        codec: Codec | None = None,
        zip_path: str | None = None,
        hash_algo: str | None = None,
        digest: str | None = None,
        name: str = "",
        executor: Executor | None = None,
        fsync: bool = True,
        priority: int = 0,
        syncer: BackgroundSync | None = None,
    ) -> None:
        super().__init__(executor, priority=priority)
        self._syncer = syncer if fsync else None
        self.raw_path = raw_path
        self.raw_size = raw_size
        self.codec = codec
        self.zip_path = zip_path if codec is not None else None
        self.hash_algo = hash_algo
        self.digest = digest
        self.name = name or raw_path
        self._fsync = fsync
        self.raw_tmp = temp_name(raw_path)
        self.zip_tmp = temp_name(self.zip_path) if self.zip_path else None
        self._raw_fh: BinaryIO | None = None
        self._zip_fh: BinaryIO | None = None
        self._fresh()

    def _fresh(self) -> None:
        self._hasher: Hasher | None = new_hasher(self.hash_algo) if self.hash_algo else None
        # The codec's decoder writes its output windows straight into the file (no output
        # buffer of each chunk's size) and stops at raw_size: a bomb costs a window.
        self._decoder: StreamDecoder | None = None
        if self.codec is not None:
            self._decoder = self.codec.stream_decoder(self._emit, self.raw_size, self.name)
        self._written = 0
        # A decoding failure is reported at the end, after the digest: with validate_hash,
        # corrupt bytes are a hash mismatch whatever the codec makes of them.
        self._broken: CorruptFile | None = None

    def _files(self) -> tuple[BinaryIO, BinaryIO | None]:
        try:
            if self._raw_fh is None:
                os.makedirs(os.path.dirname(self.raw_tmp) or ".", exist_ok=True)
                # Unbuffered: every write is already large (or zstd's window).
                self._raw_fh = open(self.raw_tmp, "wb", buffering=0)  # noqa: SIM115 - closed in _close_files
            if self.zip_tmp and self._zip_fh is None:
                self._zip_fh = open(self.zip_tmp, "wb")  # noqa: SIM115
        except OSError as exc:
            raise self._disk_error(exc) from exc
        return self._raw_fh, self._zip_fh

    def _disk_error(self, exc: OSError) -> CacheError:
        hint = " (disk full: free space or lower cache_limit)" if exc.errno == 28 else ""
        return CacheError(f"cannot write {self.raw_path}: {exc.strerror or exc}{hint}")

    def _emit(self, data: bytes | bytearray | memoryview) -> None:
        self._written += len(data)
        if self._written > self.raw_size:
            raise CorruptFile(f"{self.name}: decodes to more than the {self.raw_size} bytes index.json records")
        raw = self._raw_fh
        assert raw is not None
        view = memoryview(data)
        while view:
            n = raw.write(view)  # a raw file may write less than asked
            if not n:
                raise OSError(errno.EIO, "write() wrote nothing")
            view = view[n:]

    def _consume(self, chunks: list[bytes]) -> None:
        _, zipped = self._files()
        try:
            for chunk in chunks:
                if self._hasher is not None:
                    self._hasher.update(chunk)
                if zipped is not None:
                    zipped.write(chunk)
                if self._broken is not None:
                    continue
                try:
                    if self._decoder is None:
                        self._emit(chunk)
                    else:
                        self._decoder.decode(chunk)
                except (CompressionError, CorruptFile) as exc:
                    self._broken = exc if isinstance(exc, CorruptFile) else CorruptFile(str(exc))
                    if self._hasher is None:
                        raise self._broken from exc
        except OSError as exc:
            raise self._disk_error(exc) from exc

    def _copy_target(self) -> int | None:
        if self.codec is not None or self._hasher is not None or self.zip_tmp is not None:
            return None  # the bytes must be decoded or hashed on their way
        return self._files()[0].fileno()

    def _copied(self, count: int) -> None:
        self._written += count

    def consume_fd(self, fd: int, size: int) -> None:
        try:
            super().consume_fd(fd, size)
        except OSError as exc:
            if exc.errno in _DISK_ERRNOS:  # the cache's disk (a kernel copy cannot say which side)
                raise self._disk_error(exc) from exc
            raise

    def _reset(self) -> None:
        # New files, never the old ones rewritten: a temporary's bytes, once written, never
        # change, so a reader that read them from the file that becomes the final one read
        # the final bytes (astream._dataset.read.arriving relies on it).
        self._close_files()
        self._remove_files()
        self.raw_tmp = temp_name(self.raw_path)
        self.zip_tmp = temp_name(self.zip_path) if self.zip_path else None
        self._files()
        self._fresh()

    def _close_files(self) -> None:
        for fh in (self._raw_fh, self._zip_fh):
            if fh is not None:
                with contextlib.suppress(OSError):
                    fh.close()
        self._raw_fh = self._zip_fh = None

    def _remove_files(self) -> None:
        for path in (self.raw_tmp, self.zip_tmp):
            if path:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(path)

    def _finish(self) -> None:
        raw, zipped = self._files()
        if self._decoder is not None and self._broken is None:
            try:
                self._decoder.flush()
            except (CompressionError, CorruptFile) as exc:
                self._broken = exc if isinstance(exc, CorruptFile) else CorruptFile(str(exc))
        if self._hasher is not None and self.digest is not None:
            got = self._hasher.hexdigest()
            if got != self.digest.lower():
                raise CorruptFile(
                    f"{self.name}: {self.hash_algo} digest is {got}, index.json says {self.digest}",
                    hash_mismatch=True,
                )
        if self._broken is not None:
            raise self._broken
        if self._written != self.raw_size:
            raise CorruptFile(f"{self.name}: decodes to {self._written} bytes, index.json says {self.raw_size}")
        inline = self._fsync and self._syncer is None
        try:
            for fh, tmp, final in ((zipped, self.zip_tmp, self.zip_path), (raw, self.raw_tmp, self.raw_path)):
                if fh is None or tmp is None or final is None:
                    continue
                fh.flush()
                if inline:
                    datasync(fh.fileno())
                fh.close()
                os.replace(tmp, final)
                if self._syncer is not None:
                    # Complete but maybe not on disk yet: the syncer's marker (made durable
                    # before this rename) keeps a run after a power cut from trusting it.
                    self._syncer.submit(final)
            self._raw_fh = self._zip_fh = None
            if inline:
                fsync_dir(os.path.dirname(self.raw_path) or ".")
        except OSError as exc:
            raise self._disk_error(exc) from exc

    def _feed_file(self, source: str, chunk_size: int = 4 << 20) -> None:
        with open(source, "rb") as fh:
            while chunk := fh.read(chunk_size):
                self._consume([chunk])
        self._finish()

    async def install_from(self, source: str) -> None:
        """Run the whole pipeline on the local file ``source`` (no network), then rename into place.

        Used when the stored file is already on disk (``keep_zip`` from an earlier run,
        or a local-only dataset stored compressed).
        """
        try:
            await self.run(self._feed_file, source)
        except BaseException:
            self.abort()
            raise

    async def finish(self) -> None:
        """Check digest and size, fsync and rename into place; on any failure leave nothing."""
        try:
            await self.run(self._finish)
        except BaseException:
            self.abort()
            raise


def verify_files(cache: ShardCache, files: list[ShardFile], algo: str | None) -> str | None:
    """Hash a ready shard's files on disk (executor); returns a problem, or None if fine."""
    if algo is None:
        return "index.json has no digest to check it with"
    for f in files:
        checked = False
        for info in (f.zip, f.raw):
            if info is None or algo not in info.hashes:
                continue
            path = cache.path(info)
            try:
                hasher = new_hasher(algo)
                with open(path, "rb") as fh:
                    while chunk := fh.read(4 << 20):
                        hasher.update(chunk)
            except FileNotFoundError:
                continue
            if hasher.hexdigest() != info.hashes[algo].lower():
                return f"{path}: {algo} digest differs from index.json"
            checked = True
            break
        if not checked:
            return f"{cache.path(f.raw)}: index.json has no {algo} digest for it"
    return None
