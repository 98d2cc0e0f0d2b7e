"""Writing a dataset to a remote: ``MDSWriter(out="s3://...")`` or ``out=(local, remote)``.

The public writers (``astream.MDSWriter``, ``JSONWriter``, ``CSVWriter``, ``TSVWriter``,
``XSVWriter``) are the format layer's writers plus :class:`Uploads`. Each finished shard
file is handed (from the writer's ``_after_shard`` hook) to a private event-loop thread,
which uploads up to ``max_workers`` files at once with the usual retries; at most
``max_pending`` files wait, so a slow remote slows the writer down instead of filling
the disk or memory. ``index.json`` is uploaded last, only after every shard arrived, so a
reader never sees an index whose shards are missing. A failed upload raises
:class:`UploadError` at the next shard or at ``finish()``, never silently.

``keep_local``, ``progress_bar`` and ``max_workers`` mean what they mean to MosaicML
Streaming's writers: keep (or delete, the default) each local file once it is uploaded;
show a tqdm bar of uploaded files; upload that many files at once.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import dataclasses
import inspect
import os
import shutil
import tempfile
from collections.abc import Mapping
from typing import Any

from tqdm import tqdm

from astream._checks import check_int
from astream._format.shard_writer import ShardWriter
from astream._format.text_writer import CSVWriter as LocalCSVWriter
from astream._format.text_writer import JSONWriter as LocalJSONWriter
from astream._format.text_writer import TSVWriter as LocalTSVWriter
from astream._format.text_writer import XSVWriter as LocalXSVWriter
from astream._format.writer import MDSWriter as LocalMDSWriter
from astream._storage.base import StorageOptions
from astream._storage.loop import LoopThread
from astream._storage.registry import StoragePool, configure, join_url, scheme_of
from astream.errors import ConfigError, UploadError

__all__ = ["CSVWriter", "JSONWriter", "MDSWriter", "RemoteMDSWriter", "TSVWriter", "Uploads", "XSVWriter"]


def default_max_workers() -> int:
    """MosaicML's default upload concurrency: ``min(32, cpu_count + 4)``."""
    return min(32, (os.cpu_count() or 1) + 4)


class Uploads(ShardWriter):
    """A shard writer that also uploads the dataset to a remote as it is written.

    Put it first among the bases of a format's writer; its keywords are taken here and
    the rest go to the format's writer.

    Args:
        out: a remote URL (``"s3://bucket/ds"``, ``"http://host/ds"``, ``"file:///x"``; files
            are staged in a temporary directory), a ``(local_dir, remote_url)`` pair, or a
            plain local directory (no uploads).
        keep_local: with a remote, keep each local file after its upload (True) or delete
            it (False, MosaicML's default; a staging directory is then removed at the end).
        progress_bar: show a tqdm progress bar of the files uploaded.
        max_workers: uploads in flight at once (default ``min(32, cpu_count + 4)``).
        options: timeouts and retries of the uploads.
        storage_options: settings of the remote's backend (endpoint, credentials...), as for
            :class:`Stream`; an unknown key is refused.
        max_pending: finished files allowed to wait for upload before ``write`` blocks.
        retry: extra attempts of each upload (MosaicML's ``retry``; default ``options``' 2).

    Raises:
        ConfigError: a bad ``out``, ``keep_local``, ``progress_bar``, ``max_workers``,
            ``max_pending`` or ``retry``, or a keyword the writer does not take (a
            ``ValueError``, as MosaicML's writers raise); the message names it.
    """

    def __init__(
        self, *args: Any, keep_local: bool = False, progress_bar: bool = False, max_workers: int | None = None,
        options: StorageOptions | None = None, storage_options: Mapping[str, Any] | None = None,
        max_pending: int = 8, retry: int | None = None, **kwargs: Any,
    ) -> None:
        _check_keywords(type(self), kwargs)
        workers = default_max_workers() if max_workers is None else max_workers
        for name, value in (("max_workers", workers), ("max_pending", max_pending)):
            check_int(name, value, 1)
        for name, flag in (("keep_local", keep_local), ("progress_bar", progress_bar)):
            if not isinstance(flag, bool):
                raise ConfigError(f"{name} must be True or False, got {flag!r}")
        self.remote: str | None = None
        self.keep_local = keep_local
        self._staging: str | None = None
        self._options = options or StorageOptions()
        self._max_workers = workers
        self._max_pending = max_pending
        self._progress = progress_bar
        self._bar: Any = None
        self._uploads: list[concurrent.futures.Future[None]] = []
        self._thread: LoopThread | None = None
        self._pool: StoragePool | None = None
        self._limit: asyncio.Semaphore | None = None
        out = args[0] if args else kwargs.get("out")
        remote = out[1] if isinstance(out, tuple) and len(out) == 2 else out
        if isinstance(remote, str) and scheme_of(remote):
            self._options = configure(remote, storage_options, self._options)  # before any file is made
        elif storage_options:
            raise ConfigError(f"storage_options were given but out={out!r} names no remote")
        if retry is not None:  # MosaicML's upload retries
            policy = dataclasses.replace(self._options.retry, retries=check_int("retry", retry, 0))
            self._options = dataclasses.replace(self._options, retry=policy)
        super().__init__(*args, **kwargs)

    # -- hooks of ShardWriter -------------------------------------------------------------------
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

    def _durable_shards(self) -> bool:
        # Staged only to be uploaded and deleted: the remote copy is the durable one.
        return self.remote is None or self.keep_local

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
        if not self.keep_local:
            self._remove_local()

    def abort(self) -> None:
        """Stop without index.json; uploads in flight are cancelled. Idempotent."""
        super().abort()
        self._shutdown()
        if self._staging is not None and not self.keep_local:
            self._remove_local()

    def _remove_local(self) -> None:
        """Remove what is left of the local copy: the staging folder, or a user's folder if emptied."""
        staging, self._staging = self._staging, None
        if staging is not None:
            shutil.rmtree(staging, ignore_errors=True)
            return
        # A folder the user named is removed only if nothing of theirs is in it.
        with contextlib.suppress(OSError):
            os.rmdir(self.local)

    # -- the upload loop --------------------------------------------------------------------------
    def _loop(self) -> LoopThread:
        if self._thread is None:
            self._thread = LoopThread("astream-upload")
            if self._progress:
                self._bar = tqdm(desc=f"Uploading to {self.remote}", unit="file", dynamic_ncols=True)
        return self._thread

    def _url_of(self, path: str) -> str:
        assert self.remote is not None
        return join_url(self.remote, os.path.relpath(path, self.local).replace(os.sep, "/"))

    async def _upload(self, path: str, url: str) -> None:
        if self._pool is None:
            self._pool = StoragePool(self._options)
            self._limit = asyncio.Semaphore(self._max_workers)
        assert self._limit is not None
        async with self._limit:
            await self._pool.get(url).put(path, url)
        if not self.keep_local:
            # Off the loop: the loop thread carries every other upload's bytes.
            await asyncio.get_running_loop().run_in_executor(None, os.unlink, path)
        if self._bar is not None:
            self._bar.update(1)

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
        bar, self._bar = self._bar, None
        if thread is not None:
            pool, self._pool = self._pool, None
            if pool is not None:
                with contextlib.suppress(Exception):
                    thread.call(pool.aclose(), timeout=30)
            thread.close()
        if bar is not None:
            bar.close()


def _format_keywords(cls: type[ShardWriter]) -> tuple[str, ...]:
    """The keywords the format writer under the public writer ``cls`` takes."""
    local = next(c for c in cls.__mro__ if issubclass(c, ShardWriter) and not issubclass(c, Uploads))
    return tuple(p for p in inspect.signature(local.__init__).parameters if p != "self")


def _check_keywords(cls: type[ShardWriter], kwargs: Mapping[str, Any]) -> None:
    """Refuse a keyword neither the format writer nor the uploads take (MosaicML: ValueError)."""
    known = _format_keywords(cls)
    unknown = sorted(set(kwargs) - set(known))
    if unknown:
        uploads = [p for p in inspect.signature(Uploads.__init__).parameters
                   if p not in ("self", "args", "kwargs")]
        raise ConfigError(f"{cls.__name__} got unknown argument(s) {', '.join(unknown)}; it takes "
                          f"{', '.join([*known, *uploads])}")


def _signature(local: type[ShardWriter]) -> inspect.Signature:
    """The format's parameters followed by the upload keywords, for ``help()`` and IDEs."""
    own = [p.replace(annotation="str | os.PathLike[str] | tuple[str | os.PathLike[str], str]") if p.name == "out" else p
           for p in inspect.signature(local.__init__).parameters.values() if p.name != "self"]
    extra = [p for p in inspect.signature(Uploads.__init__).parameters.values()
             if p.kind is inspect.Parameter.KEYWORD_ONLY]
    return inspect.Signature([*own, *extra])


_UPLOAD_ARGS = """
    Uploads: ``out`` may also be a remote URL or a ``(local_dir, remote_url)`` pair; then
    ``keep_local`` (default False: delete each local file once uploaded), ``progress_bar``
    (a tqdm bar of uploaded files), ``max_workers`` (uploads at once, default
    ``min(32, cpu_count + 4)``), ``options`` (timeouts, retries) and ``max_pending`` apply;
    see :class:`astream._storage.upload.Uploads`.
"""


class MDSWriter(Uploads, LocalMDSWriter):
    __doc__ = (LocalMDSWriter.__doc__ or "") + _UPLOAD_ARGS


class JSONWriter(Uploads, LocalJSONWriter):
    __doc__ = (LocalJSONWriter.__doc__ or "") + _UPLOAD_ARGS


class XSVWriter(Uploads, LocalXSVWriter):
    __doc__ = (LocalXSVWriter.__doc__ or "") + _UPLOAD_ARGS


class CSVWriter(Uploads, LocalCSVWriter):
    __doc__ = (LocalCSVWriter.__doc__ or "") + _UPLOAD_ARGS


class TSVWriter(Uploads, LocalTSVWriter):
    __doc__ = (LocalTSVWriter.__doc__ or "") + _UPLOAD_ARGS


for _public, _local in ((MDSWriter, LocalMDSWriter), (JSONWriter, LocalJSONWriter), (XSVWriter, LocalXSVWriter),
                        (CSVWriter, LocalCSVWriter), (TSVWriter, LocalTSVWriter)):
    _public.__signature__ = _signature(_local)  # type: ignore[union-attr]

RemoteMDSWriter = MDSWriter  # the name the storage tests and docs of this module use
