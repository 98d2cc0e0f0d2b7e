"""Where a transfer's bytes go: sinks that move every disk write off the event loop.

A backend streams a body into a :class:`Sink` chunk by chunk. :class:`BufferedSink`
gathers chunks into buffers of about a MiB and hands each buffer to a worker thread,
keeping at most one buffer in flight, so the network and the disk work overlap and no
large write ever runs on the loop. Subclasses say what "consume" means: plain
:class:`FileSink` writes a file; the shard cache's sink also hashes and decompresses.

``abort()`` is synchronous on purpose: it runs in ``finally`` blocks of cancelled
tasks, removes the temporary files at once and closes them as soon as the worker
thread is done with them, so a cancelled transfer leaves nothing behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import threading
import time
from concurrent.futures import Executor
from typing import BinaryIO, Protocol

from astream._format.files import fsync_dir  # the one implementation, re-exported for the cache
from astream._storage.executor import PriorityExecutor
from astream.errors import DownloadError

__all__ = ["BufferedSink", "BytesSink", "FileSink", "Sink", "copy_range", "datasync", "fsync_dir", "read_limited"]

# Small enough that the decoding of a shard keeps pace with its bytes (little is left to
# do when the last byte arrives), large enough that the hop to a thread costs little.
FLUSH_BYTES = 1 << 20


class Sink(Protocol):
    """Receives the body of one remote object, in order, possibly over several attempts."""

    @property
    def received(self) -> int:
        """Bytes accepted so far; a resumed transfer asks the remote for the rest."""
        ...

    async def write(self, data: bytes) -> None:
        """Accept the next bytes of the object."""
        ...

    async def restart(self) -> None:
        """Forget everything received: the remote sends the object again from byte 0."""
        ...


def datasync(fd: int) -> None:
    """Flush a file's data (and the metadata needed to read it back) to the device."""
    sync = getattr(os, "fdatasync", os.fsync)  # fdatasync is not on every platform
    sync(fd)


_NO_KERNEL_COPY = {errno.EXDEV, errno.ENOSYS, errno.EOPNOTSUPP, errno.EINVAL, errno.ENOTSUP, errno.ENOTSOCK}


def copy_range(src: int, dst: int, offset: int, count: int) -> int:
    """Copy ``count`` bytes of file ``src`` from ``offset`` to ``dst``'s position, in the kernel.

    ``copy_file_range`` (no copy through user space; a reflink or a server-side copy where
    the filesystem offers one), else ``sendfile``, else plain reads and writes. Returns the
    bytes copied: fewer than ``count`` only if ``src`` ends first.
    """
    done = 0
    method = 0 if hasattr(os, "copy_file_range") else 1
    while done < count:
        want = min(count - done, 1 << 30)
        try:
            if method == 0:
                n = os.copy_file_range(src, dst, want, offset + done)
            elif method == 1:
                n = os.sendfile(dst, src, offset + done, want)
            else:
                data = os.pread(src, min(want, FLUSH_BYTES), offset + done)
                view, n = memoryview(data), len(data)
                while view:
                    view = view[os.write(dst, view):]
        except OSError as exc:
            if method < 2 and exc.errno in _NO_KERNEL_COPY and done == 0:
                method += 1  # not between these files (or not on this system): the next way
                continue
            raise
        if n == 0:
            break
        done += n
    return done


class BufferedSink:
    """A sink that consumes buffered chunks in an executor, one buffer at a time."""

    def __init__(self, executor: Executor | None = None, flush_bytes: int | None = None, priority: int = 0) -> None:
        self._executor = executor
        self.priority = priority
        self._flush_bytes = flush_bytes or FLUSH_BYTES
        self._buf: list[bytes] = []
        self._buffered = 0
        self._received = 0
        self._pending: asyncio.Future[None] | None = None
        self._lock = threading.Lock()
        self._serial = threading.Lock()
        self._busy = False
        self._aborted = False
        self.busy_s = 0.0  # seconds its jobs ran in the executor (the cache's decode stage)

    @property
    def received(self) -> int:
        return self._received

    # -- subclass hooks (run in the executor thread) -------------------------------------
    def _consume(self, chunks: list[bytes]) -> None:
        raise NotImplementedError

    def _reset(self) -> None:
        raise NotImplementedError

    def _close_files(self) -> None:
        raise NotImplementedError

    def _remove_files(self) -> None:
        raise NotImplementedError

    def _copy_target(self) -> int | None:
        """The fd the bytes go to unchanged (a kernel copy may fill it), or None."""
        return None

    def _copied(self, count: int) -> None:
        """``count`` bytes went to :meth:`_copy_target` by a kernel copy."""

    def consume_fd(self, fd: int, size: int) -> None:
        """Take the rest of the open file ``fd`` (from :attr:`received` to ``size``) in one job.

        Run it through :meth:`run` (it runs in the executor). A source on the local disk
        thus never crosses the event loop; where the bytes go unchanged to one file the
        kernel copies them (:func:`copy_range`).
        """
        if self._received < size:
            self.consume_range(fd, self._received, size - self._received)

    def consume_range(self, fd: int, offset: int, count: int) -> int:
        """Take ``count`` bytes of the open file ``fd`` from ``offset`` (in a :meth:`run` job,
        as :meth:`consume_fd`); returns the bytes taken, fewer only if the file ends first."""
        target = self._copy_target()
        done = 0
        while done < count and not self._aborted:
            if target is not None:
                n = copy_range(fd, target, offset + done, min(count - done, 64 << 20))
                self._copied(n)
            else:
                data = os.pread(fd, min(FLUSH_BYTES, count - done), offset + done)
                n = len(data)
                if n:
                    self._consume([data])
            if n == 0:
                break  # the file is shorter than it was: the caller sees fewer bytes
            self._received += n
            done += n
        return done

    def consume_data(self, data: bytes) -> None:
        """Take ``data`` (in a :meth:`run` job, as :meth:`consume_fd`)."""
        if data and not self._aborted:
            self._consume([data])
            self._received += len(data)

    # -- async face ------------------------------------------------------------------------
    def _run(self, fn: object, *args: object) -> asyncio.Future[None]:
        def job() -> None:
            # One job of this sink at a time, even when the task that
            # awaited an earlier one gave up on it (a timeout, then a retry).
            with self._serial:
                with self._lock:
                    if self._aborted:
                        return
                    self._busy = True
                start = time.perf_counter()
                try:
                    fn(*args)  # type: ignore[operator]
                finally:
                    self.busy_s += time.perf_counter() - start
                    with self._lock:
                        self._busy = False
                        if self._aborted:
                            self._close_files()
                            with contextlib.suppress(OSError):
                                self._remove_files()

        if isinstance(self._executor, PriorityExecutor):
            return asyncio.wrap_future(self._executor.submit_priority(self.priority, job))
        return asyncio.get_running_loop().run_in_executor(self._executor, job)

    async def _wait_pending(self) -> None:
        fut, self._pending = self._pending, None
        if fut is not None:
            await fut

    async def write(self, data: bytes) -> None:
        if not data:
            return
        self._buf.append(data)
        self._buffered += len(data)
        self._received += len(data)
        if self._buffered >= self._flush_bytes:
            await self._dispatch()

    async def _dispatch(self) -> None:
        await self._wait_pending()
        if self._buf:
            chunks, self._buf, self._buffered = self._buf, [], 0
            self._pending = self._run(self._consume, chunks)

    async def drain(self) -> None:
        """Wait until every byte received so far has been consumed."""
        await self._dispatch()
        await self._wait_pending()

    async def restart(self) -> None:
        self._buf, self._buffered, self._received = [], 0, 0
        with contextlib.suppress(Exception):
            await self._wait_pending()
        await self._run(self._reset)

    async def run(self, fn: object, *args: object) -> None:
        """Run ``fn(*args)`` in the executor after everything received so far is consumed."""
        await self.drain()
        await self._run(fn, *args)

    def abort(self) -> None:
        """Drop the transfer: remove the temporary files now, close them when the worker is done."""
        self._buf, self._buffered = [], 0
        with self._lock:
            if self._aborted:
                return
            self._aborted = True
            busy = self._busy
        with contextlib.suppress(OSError):
            self._remove_files()
        if not busy:
            self._close_files()


class FileSink(BufferedSink):
    """Writes an object to ``<path>.<token>.tmp``; :meth:`commit` fsyncs and renames it to ``path``.

    Args:
        limit: refuse an object larger than this many bytes (an index: what it costs to
            parse it is bounded by what is fetched); ``name`` says which in the error.
    """

    def __init__(self, path: str, executor: Executor | None = None, fsync: bool = True,
                 limit: int | None = None, name: str = "") -> None:
        super().__init__(executor)
        self.limit = limit
        self.name = name or path
        self.path = path
        self.tmp_path = f"{path}.{os.getpid()}.{os.urandom(4).hex()}.tmp"
        self._fsync = fsync
        self._fh: BinaryIO | None = None

    def _open(self) -> BinaryIO:
        if self._fh is None:
            self._fh = open(self.tmp_path, "wb")  # noqa: SIM115 - closed in _close_files
        return self._fh

    def _check_limit(self, more: int) -> None:
        if self.limit is not None and self.received + more > self.limit:
            raise DownloadError(f"{self.name}: more than {self.limit} bytes, the most astream reads of this file "
                                "(an index is never that large: is this the right URL?)")

    async def write(self, data: bytes) -> None:
        self._check_limit(len(data))
        await super().write(data)

    def consume_range(self, fd: int, offset: int, count: int) -> int:
        self._check_limit(count)
        return super().consume_range(fd, offset, count)

    def _consume(self, chunks: list[bytes]) -> None:
        fh = self._open()
        for chunk in chunks:
            fh.write(chunk)

    def _reset(self) -> None:
        fh = self._open()
        fh.seek(0)
        fh.truncate()

    def _close_files(self) -> None:
        if self._fh is not None:
            with contextlib.suppress(OSError):
                self._fh.close()
            self._fh = None

    def _remove_files(self) -> None:
        os.unlink(self.tmp_path)

    def _copy_target(self) -> int | None:
        return self._open().fileno()

    def _commit(self) -> None:
        fh = self._open()
        fh.flush()
        if self._fsync:
            datasync(fh.fileno())
        fh.close()
        self._fh = None
        os.replace(self.tmp_path, self.path)
        if self._fsync:
            fsync_dir(os.path.dirname(os.path.abspath(self.path)))

    async def commit(self) -> None:
        """Make the file appear at ``path``, complete, or raise (the temporary is then removed)."""
        try:
            await self.run(self._commit)
        except BaseException:
            self.abort()
            raise


class BytesSink:
    """Keeps an object in memory, refusing one over ``limit`` bytes as it arrives (an index
    or a listing's index: small files whose size the other side decides)."""

    def __init__(self, url: str, limit: int) -> None:
        self.url = url
        self.limit = limit
        self._parts: list[bytes] = []
        self._received = 0

    @property
    def received(self) -> int:
        return self._received

    async def write(self, data: bytes) -> None:
        if self._received + len(data) > self.limit:
            raise DownloadError(f"{self.url}: more than {self.limit} bytes, the most astream reads of this file "
                                "(an index is never that large: is this the right URL?)")
        self._parts.append(data)
        self._received += len(data)

    async def restart(self) -> None:
        self._parts, self._received = [], 0

    def value(self) -> bytes:
        """The object's bytes (once the transfer ended)."""
        return b"".join(self._parts)


class _FetchesInto(Protocol):
    async def fetch_into(self, url: str, sink: Sink) -> None: ...


async def read_limited(storage: _FetchesInto, url: str, limit: int) -> bytes:
    """The whole object at ``url``, refused (``DownloadError``) past ``limit`` bytes as it arrives.

    For the small files whose size someone else decides (an index.json, a written
    WebDataset or Parquet index): what a hostile one costs is bounded before it is parsed.
    """
    sink = BytesSink(url, limit)
    await storage.fetch_into(url, sink)
    return sink.value()
