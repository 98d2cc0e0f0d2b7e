"""A small whole-file shard fetcher for the coordination layer's tests (no eviction).

It was ``astream._coord.provider.SimpleProvider``; the package now has one fetcher, the
shard engine, and this one lives with the tests that exercise the agent without it.
Its factory must be pickled as ``tests.coord.simple_provider.SimpleProviderFactory`` so
an agent process (whose ``PYTHONPATH`` is the repository root) can import it.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import shutil
import uuid
from dataclasses import dataclass
from typing import Any

from astream._coord.provider import StageCallback
from astream.errors import AstreamError, ConfigError, DownloadError, RemoteNotFoundError

TMP_MARK = ".astream-tmp-"


def resolve_key(root: str, key: str) -> str:
    """The path of ``key`` under ``root``, refusing absolute keys and ``..`` escapes.

    Raises:
        ConfigError: the key is not a plain relative path.
    """
    norm = os.path.normpath(key)
    if os.path.isabs(key) or norm.startswith("..") or norm in (".", "") or TMP_MARK in key:
        raise ConfigError(f"shard key {key!r} must be a relative path inside the cache")
    return os.path.join(root, norm)


@dataclass(frozen=True)
class SimpleProviderFactory:
    """Picklable factory of :class:`SimpleProvider` (see its arguments)."""

    remote: str
    local: str
    max_concurrency: int = 8

    def __call__(self) -> SimpleProvider:
        return SimpleProvider(self.remote, self.local, max_concurrency=self.max_concurrency)


class SimpleProvider:
    """Copy shards from a local directory, or download them over HTTP, into ``local``.

    Downloads go to a hidden temp file in the target's folder, are fsynced and renamed
    into place, so a shard is either complete or absent whatever instant the process
    dies. No eviction: pins are only counted.

    Args:
        remote: a local directory, or an ``http://``/``https://`` URL prefix.
        local: the node's cache root.
        max_concurrency: downloads running at once; the others wait in stage ``"queue"``.
    """

    def __init__(self, remote: str, local: str, *, max_concurrency: int = 8) -> None:
        if max_concurrency < 1:
            raise ConfigError(f"max_concurrency must be >= 1, got {max_concurrency}")
        self.remote = remote.rstrip("/")
        self.local = os.path.realpath(local)
        self._http = self.remote.startswith(("http://", "https://"))
        self._slots = asyncio.Semaphore(max_concurrency)
        self._present: set[str] = set()
        self._pins: dict[str, int] = {}
        self._session: Any = None
        self._counters = {"downloads": 0, "download_bytes": 0, "failures": 0, "removed_partials": 0}

    async def rebuild(self) -> None:
        """Drop partial downloads, index complete files."""
        present, removed = await asyncio.to_thread(_scan, self.local)
        self._present = present
        self._counters["removed_partials"] += removed

    def lookup(self, key: str) -> str | None:
        """Local path of ``key`` if already downloaded."""
        return os.path.join(self.local, key) if key in self._present else None

    async def ensure(self, key: str, stage: StageCallback) -> str:
        """Download ``key`` unless present; return its path."""
        path = resolve_key(self.local, key)
        if key in self._present:
            return path
        stage("queue")
        async with self._slots:
            stage("download")
            tmp = os.path.join(os.path.dirname(path), f".{os.path.basename(path)}{TMP_MARK}{uuid.uuid4().hex[:12]}")
            try:
                if self._http:
                    size = await self._download(key, tmp)
                else:
                    size = await asyncio.to_thread(_copy, os.path.join(self.remote, key), tmp)
                await asyncio.to_thread(os.replace, tmp, path)
            except BaseException as exc:
                self._counters["failures"] += 1
                await asyncio.shield(asyncio.to_thread(_unlink_quiet, tmp))
                if isinstance(exc, AstreamError) or not isinstance(exc, Exception):
                    raise
                raise DownloadError(f"shard {key!r} from {self.remote}: {type(exc).__name__}: {exc}") from exc
        self._counters["downloads"] += 1
        self._counters["download_bytes"] += size
        self._present.add(key)
        return path

    async def _download(self, key: str, tmp: str) -> int:
        import aiohttp

        if self._session is None:
            self._session = aiohttp.ClientSession(timeout=aiohttp.ClientTimeout(total=300))
        url = f"{self.remote}/{key}"
        async with self._session.get(url) as response:
            if response.status == 404:
                raise RemoteNotFoundError(f"shard {key!r}: {url} answered 404")
            if response.status != 200:
                raise DownloadError(f"shard {key!r}: {url} answered HTTP {response.status}")
            data = await response.read()
        await asyncio.to_thread(_write, tmp, data)
        return len(data)

    def on_pins_changed(self, key: str, pins: int) -> None:
        """Record node-wide pins (no eviction here)."""
        if pins:
            self._pins[key] = pins
        else:
            self._pins.pop(key, None)

    def stats(self) -> dict[str, Any]:
        """Counters, plus present and pinned shard counts."""
        return {**self._counters, "present": len(self._present), "pinned": len(self._pins)}

    async def aclose(self) -> None:
        """Close the HTTP session if one was opened."""
        session, self._session = self._session, None
        if session is not None:
            await session.close()


def _scan(root: str) -> tuple[set[str], int]:
    present: set[str] = set()
    removed = 0
    for folder, _dirs, files in os.walk(root):
        for name in files:
            full = os.path.join(folder, name)
            if TMP_MARK in name:
                _unlink_quiet(full)
                removed += 1
            else:
                present.add(os.path.relpath(full, root))
    return present, removed


def _write(path: str, data: bytes) -> None:
    os.makedirs(os.path.dirname(path), exist_ok=True)
    with open(path, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())


def _copy(src: str, tmp: str) -> int:
    if not os.path.isfile(src):
        raise RemoteNotFoundError(f"shard file {src} does not exist")
    os.makedirs(os.path.dirname(tmp), exist_ok=True)
    with open(src, "rb") as fin, open(tmp, "wb") as fout:
        shutil.copyfileobj(fin, fout, 1 << 20)
        fout.flush()
        os.fsync(fout.fileno())
        return fout.tell()


def _unlink_quiet(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
