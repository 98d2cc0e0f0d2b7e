"""Writing an MDS dataset to a remote: ``MDSWriter(out="s3://...")`` or ``out=(local, remote)``.

:class:`MDSWriter` (public as ``astream.MDSWriter``) is the format layer's writer
plus uploads. Each finished shard file is handed (from the writer's ``_after_shard``
hook) to a private event-loop thread, which uploads up to ``max_concurrency`` files at
once with the usual retries; at most ``max_pending`` files wait, so a slow remote slows
the writer down instead of filling the disk or memory. ``index.json`` is uploaded last,
only after every shard arrived, so a reader never sees an index whose shards are
missing. A failed upload raises :class:`UploadError` at the next shard or at
``finish()``, never silently.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import os
import shutil
import tempfile
from collections.abc import Mapping, Sequence
from typing import Any

from astream._format.writer import MDSWriter as LocalMDSWriter
from astream._storage.base import StorageOptions
from astream._storage.loop import LoopThread
from astream._storage.registry import StoragePool, configure, join_url, scheme_of
from astream.errors import ConfigError, UploadError

__all__ = ["MDSWriter", "RemoteMDSWriter"]


class MDSWriter(LocalMDSWriter):
    """An :class:`MDSWriter` that also uploads the dataset to a remote as it is written.

    Args:
        out: a remote URL (``"s3://bucket/ds"``, ``"http://host/ds"``, ``"file:///x"``;
            shards are staged in a temporary directory that is removed at the end), a
            ``(local_dir, remote_url)`` pair (the local copy is kept), or a plain local
            directory (no uploads).
        columns, compression, hashes, size_limit, exist_ok: as for :class:`MDSWriter`.
        options: timeouts and retries of the uploads.
        storage_options: settings of the remote's backend (endpoint, credentials...), as for
            :class:`Stream`; an unknown key is refused.
        max_concurrency: uploads in flight at once.
        max_pending: finished files allowed to wait for upload before ``write`` blocks.

    Raises:
        ConfigError: a bad ``out`` or limit.
    """

    def __init__(
        self,
        out: str | os.PathLike[str] | tuple[str | os.PathLike[str], str],
        columns: Mapping[str, str],
        compression: str | None = None,
        hashes: Sequence[str] | None = None,
        size_limit: int | str | None = 1 << 26,
        exist_ok: bool = False,
        *,
        options: StorageOptions | None = None,
        storage_options: Mapping[str, Any] | None = None,
        max_concurrency: int = 4,
        max_pending: int = 8,
    ) -> None:
        for name, value in (("max_concurrency", max_concurrency), ("max_pending", max_pending)):
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"{name} must be a positive integer, got {value!r}")
        self.remote: str | None = None
        self._staging: str | None = None
        self._options = options or StorageOptions()
        self._max_concurrency = max_concurrency
        self._max_pending = max_pending
        self._uploads: list[concurrent.futures.Future[None]] = []
        self._thread: LoopThread | None = None
        self._pool: StoragePool | None = None
        self._limit: asyncio.Semaphore | None = None
        remote = out[1] if isinstance(out, tuple) and len(out) == 2 else out
        if isinstance(remote, str) and scheme_of(remote):
            self._options = configure(remote, storage_options, self._options)  # before any file is made
        elif storage_options:
            raise ConfigError(f"storage_options were given but out={out!r} names no remote")
        super().__init__(out, columns, compression, hashes, size_limit, exist_ok)  # type: ignore[arg-type]

    # -- hooks of MDSWriter ---------------------------------------------------------------------
    def _local_dir(self, out: Any) -> str:
        if isinstance(out, tuple):
            if len(out) != 2 or not isinstance(out[1], str):
                raise ConfigError(f"out must be (local_dir, remote_url), got {out!r}")
            self.remote = out[1]
            return super()._local_dir(out[0])
        path = os.fspath(out)
        if isinstance(path, str) and scheme_of(path):
            self.remote = path
            self._staging = tempfile.mkdtemp(prefix="astream-upload-")
            return self._staging
        return super()._local_dir(out)

    def _after_shard(self, paths: list[str]) -> None:
        if self.remote is None:
            return
        self._raise_failed()
        for path in paths:
            self._wait_below(self._max_pending)
            self._uploads.append(self._loop().submit(self._upload(path, self._url_of(path))))

    def _after_index(self, path: str) -> None:
        if self.remote is None:
            return
        try:
            self._wait_below(1)
            self._raise_failed()
            self._loop().call(self._upload(path, self._url_of(path)))
        except concurrent.futures.CancelledError as exc:  # pragma: no cover - closed under us
            raise UploadError(f"upload of {path} to {self.remote} was cancelled") from exc
        finally:
            self._shutdown()
            self._remove_staging()

    def abort(self) -> None:
        """Stop without index.json; uploads in flight are cancelled. Idempotent."""
        super().abort()
        self._shutdown()
        self._remove_staging()

    def _remove_staging(self) -> None:
        staging, self._staging = self._staging, None
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)

    # -- the upload loop --------------------------------------------------------------------------
    def _loop(self) -> LoopThread:
        if self._thread is None:
            self._thread = LoopThread("astream-upload")
        return self._thread

    def _url_of(self, path: str) -> str:
        assert self.remote is not None
        return join_url(self.remote, os.path.relpath(path, self.local).replace(os.sep, "/"))

    async def _upload(self, path: str, url: str) -> None:
        if self._pool is None:
            self._pool = StoragePool(self._options)
            self._limit = asyncio.Semaphore(self._max_concurrency)
        assert self._limit is not None
        async with self._limit:
            await self._pool.get(url).put(path, url)

    def _wait_below(self, limit: int) -> None:
        """Block until fewer than ``limit`` uploads are unfinished."""
        pending = [f for f in self._uploads if not f.done()]
        while len(pending) >= limit:
            concurrent.futures.wait(pending, return_when=concurrent.futures.FIRST_COMPLETED)
            pending = [f for f in pending if not f.done()]

    def _raise_failed(self) -> None:
        for fut in self._uploads:
            if fut.done() and not fut.cancelled() and fut.exception() is not None:
                exc = fut.exception()
                self._shutdown()
                if isinstance(exc, UploadError):
                    raise exc
                raise UploadError(f"uploading to {self.remote} failed: {exc}") from exc
        self._uploads = [f for f in self._uploads if not f.done()]

    def _shutdown(self) -> None:
        thread, self._thread = self._thread, None
        if thread is None:
            return
        pool, self._pool = self._pool, None
        if pool is not None:
            with contextlib.suppress(Exception):
                thread.call(pool.aclose(), timeout=30)
        thread.close()


RemoteMDSWriter = MDSWriter  # the name the storage tests and docs of this module use
