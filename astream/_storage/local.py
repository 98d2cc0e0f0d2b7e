"""Local paths and ``file://`` URLs as a remote (a dataset on a mounted or local disk).

Reads go through aiofiles' worker threads in large chunks, so a slow network
filesystem never blocks the loop. A missing file is :class:`RemoteNotFoundError`,
an unreadable one a :class:`DownloadError`; neither is retried, as retrying cannot help.
"""

from __future__ import annotations

import asyncio
import errno
import os
import shutil
from collections.abc import Callable
from urllib.parse import unquote, urlsplit

import aiofiles
import aiofiles.os

from astream._format.names import checked_listing
from astream._storage.answers import (
    check_range,
    range_past_end,
)
from astream._storage.base import (
    ObjectInfo,
    Storage,
    TransferEvents,
    Transient,
    with_retries,
)
from astream._storage.sink import BufferedSink, Sink
from astream.errors import DownloadError, RemoteNotFoundError, SizeMismatchError, StorageError, UploadError

__all__ = ["LocalStorage", "local_path_of"]

# Errors of a flaky network filesystem that another attempt may fix.
_TRANSIENT_ERRNOS = {errno.EIO, errno.EAGAIN, errno.ETIMEDOUT, errno.ESTALE, errno.EINTR}


def local_path_of(url: str) -> str:
    """The filesystem path of a plain path or ``file://`` URL."""
    if url.startswith("file://"):
        parts = urlsplit(url)
        if parts.netloc not in ("", "localhost"):
            raise StorageError(f"{url}: file:// URLs must name a local path (file:///abs/path)")
        return unquote(parts.path)
    return url


def _translate(url: str, exc: OSError, verb: str = "read") -> Exception:
    if isinstance(exc, FileNotFoundError):
        return RemoteNotFoundError(f"{url}: no such file; check the remote path and the split")
    if isinstance(exc, PermissionError):
        return DownloadError(f"{url}: permission denied; the process cannot {verb} this file")
    if exc.errno in _TRANSIENT_ERRNOS:
        return Transient(f"{type(exc).__name__}: {exc}")
    return DownloadError(f"{url}: cannot {verb}: {exc}")


class LocalStorage(Storage):
    """A remote that is a directory on this machine."""

    schemes = ("", "file")

    async def fetch_into(
        self, url: str, sink: Sink, *, size: int | None = None, events: TransferEvents | None = None
    ) -> None:
        ev = events or self.events
        path = local_path_of(url)
        chunk = self.options.chunk_size
        if isinstance(sink, BufferedSink):
            await self._fetch_file_into(url, path, sink, size, ev)
            return

        async def attempt(n: int) -> None:
            try:
                async with aiofiles.open(path, "rb") as fh:
                    actual = os.fstat(fh.fileno()).st_size
                    if size is not None and actual != size:
                        raise SizeMismatchError(
                            f"{url}: the file is {actual} bytes but index.json says {size}; "
                            "the dataset changed after its index was written"
                        )
                    await fh.seek(sink.received)
                    while True:
                        data = await fh.read(chunk)
                        if not data:
                            break
                        await sink.write(data)
                        ev.on_bytes(len(data))
            except OSError as exc:
                if isinstance(exc, StorageError):
                    raise
                raise _translate(url, exc) from exc
            if size is not None and sink.received != size:
                raise Transient(f"read {sink.received} of {size} bytes (the file changed while read)")

        await with_retries(url, attempt, self.options, ev)

    async def _fetch_file_into(
        self, url: str, path: str, sink: BufferedSink, size: int | None, ev: TransferEvents
    ) -> None:
        """The whole file in one job of the sink's thread: no hop through the loop per chunk,
        and a kernel copy (``copy_file_range``) where the bytes go to the cache unchanged."""

        def job(fd: int) -> None:
            actual = os.fstat(fd).st_size
            if size is not None and actual != size:
                raise SizeMismatchError(
                    f"{url}: the file is {actual} bytes but index.json says {size}; "
                    "the dataset changed after its index was written"
                )
            sink.consume_fd(fd, actual)

        async def attempt(n: int) -> None:
            before = sink.received
            try:
                await self._in_sink_job(url, path, sink, job)
            finally:
                ev.on_bytes(sink.received - before)
            if size is not None and sink.received != size:
                raise Transient(f"read {sink.received} of {size} bytes (the file changed while read)")

        await with_retries(url, attempt, self.options, ev)

    async def copy_into(self, url: str, sink: BufferedSink, job: Callable[[int], None]) -> None:
        """Run ``job(fd)`` on the file at ``url``, opened read-only, in one job of ``sink``'s
        thread (it feeds the sink there: :meth:`BufferedSink.consume_range`); retried from an
        empty sink by the storage's policy, the file's ``OSError``s translated as every read's.

        A shard made of ranges of a local file (a Parquet row group) is thus copied without
        a hop through the loop per range, where a resume's first batch waits for it.
        """
        path = local_path_of(url)

        async def attempt(n: int) -> None:
            if sink.received:
                await sink.restart()
            await self._in_sink_job(url, path, sink, job)

        await with_retries(url, attempt, self.options, self.events)

    @staticmethod
    async def _in_sink_job(url: str, path: str, sink: BufferedSink, job: Callable[[int], None]) -> None:
        def opened() -> None:
            try:
                fd = os.open(path, os.O_RDONLY)
            except OSError as exc:
                raise _translate(url, exc) from exc
            try:
                job(fd)
            except OSError as exc:
                if isinstance(exc, StorageError):
                    raise
                raise _translate(url, exc) from exc
            finally:
                os.close(fd)

        await sink.run(opened)

    async def read_bytes(self, url: str) -> bytes:
        path = local_path_of(url)

        async def attempt(n: int) -> bytes:
            try:
                async with aiofiles.open(path, "rb") as fh:
                    return bytes(await fh.read())
            except OSError as exc:
                raise _translate(url, exc) from exc

        return await with_retries(url, attempt, self.options, self.events)

    async def read_range(self, url: str, start: int, end: int) -> bytes:
        start, end = check_range(url, start, end)
        if start == end:
            return b""
        path = local_path_of(url)
        length = end - start

        def job() -> bytes:
            # open, fstat and pread all in the executor: on a network filesystem any of them
            # can block for seconds. pread leaves no shared file offset to race on.
            fd = os.open(path, os.O_RDONLY)
            try:
                size = os.fstat(fd).st_size
                if size < end:
                    raise range_past_end(url, size, start, end)
                parts: list[bytes] = []
                got = 0
                while got < length:
                    data = os.pread(fd, length - got, start + got)  # may return less (2 GiB cap)
                    if not data:
                        break
                    parts.append(data)
                    got += len(data)
            finally:
                os.close(fd)
            return parts[0] if len(parts) == 1 else b"".join(parts)

        async def attempt(n: int) -> bytes:
            try:
                data = await asyncio.get_running_loop().run_in_executor(None, job)
            except OSError as exc:
                if isinstance(exc, StorageError):
                    raise
                raise _translate(url, exc) from exc
            if len(data) != length:
                # The file shrank between fstat and pread; the next attempt sees its new size.
                raise Transient(f"read {len(data)} of {length} bytes at {start} (the file changed while read)")
            return data

        return await with_retries(url, attempt, self.options, self.events)

    async def exists(self, url: str) -> bool:
        return bool(await aiofiles.os.path.exists(local_path_of(url)))

    async def stat(self, url: str) -> ObjectInfo:
        try:
            st = await aiofiles.os.stat(local_path_of(url))
        except OSError as exc:
            raise _translate(url, exc) from exc
        return ObjectInfo(st.st_size, f"{st.st_mtime_ns:x}-{st.st_size:x}")

    async def list_objects(self, url: str) -> list[tuple[str, ObjectInfo]]:
        root = local_path_of(url)

        def walk() -> list[tuple[str, ObjectInfo]]:
            out = []
            for folder, dirs, files in os.walk(root):
                dirs.sort()
                for name in files:
                    path = os.path.join(folder, name)
                    st = os.stat(path)
                    rel = os.path.relpath(path, root).replace(os.sep, "/")
                    out.append((rel, ObjectInfo(st.st_size, f"{st.st_mtime_ns:x}-{st.st_size:x}")))
            return out

        if not await aiofiles.os.path.isdir(root):
            raise _translate(url, FileNotFoundError(errno.ENOENT, "no such directory", root))
        try:
            listed = await asyncio.get_running_loop().run_in_executor(None, walk)
        except OSError as exc:
            raise _translate(url, exc) from exc
        return checked_listing(url, listed)

    async def put(self, local_path: str, url: str) -> None:
        dest = local_path_of(url)
        tmp = f"{dest}.{os.getpid()}.{os.urandom(4).hex()}.tmp"

        def copy() -> None:
            if os.path.normpath(dest) == os.path.normpath(local_path):
                return
            os.makedirs(os.path.dirname(os.path.abspath(dest)), exist_ok=True)
            try:
                shutil.copyfile(local_path, tmp)
                os.replace(tmp, dest)
            except BaseException:
                if os.path.exists(tmp):
                    os.unlink(tmp)
                raise

        async def attempt(n: int) -> None:
            try:
                await asyncio.get_running_loop().run_in_executor(None, copy)
            except OSError as exc:
                err = _translate(url, exc, "write")
                if isinstance(err, Transient):
                    raise err from exc
                raise UploadError(f"{url}: cannot upload {local_path}: {exc}") from exc

        await with_retries(url, attempt, self.options, self.events, verb="upload")
