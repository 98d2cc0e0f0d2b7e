"""Which backend serves a URL, and a per-loop pool that owns one instance per scheme.

``storage_class(url)`` picks the class by scheme (a plain path is local). A
:class:`StoragePool` is what the cache engine holds: it creates each backend once,
lazily, on the loop that uses it (so one aiohttp session per loop), and closes them
together. New schemes (``astream.testing``'s in-memory ``memory://``) are added
with :func:`register`.
"""

from __future__ import annotations

import posixpath
import re
from collections.abc import Callable
from types import TracebackType

from astream._storage.base import Storage, StorageOptions, TransferEvents
from astream._storage.local import LocalStorage
from astream.errors import ConfigError

__all__ = ["StoragePool", "join_url", "register", "scheme_of", "storage_class"]

Factory = Callable[[StorageOptions, TransferEvents | None], Storage]

_SCHEME = re.compile(r"^([a-zA-Z][a-zA-Z0-9+.-]*)://")


def _http(options: StorageOptions, events: TransferEvents | None) -> Storage:
    # aiohttp costs ~0.1 s to import, paid by every process (workers too); import it
    # only in processes that talk HTTP.
    from astream._storage.http import HttpStorage

    return HttpStorage(options, events)


def _s3(options: StorageOptions, events: TransferEvents | None) -> Storage:
    from astream._storage.s3 import S3Storage  # aiobotocore is optional: import it only when used

    return S3Storage(options, events)


_FACTORIES: dict[str, Factory] = {
    "": LocalStorage,
    "file": LocalStorage,
    "http": _http,
    "https": _http,
    "s3": _s3,
}


def scheme_of(url: str) -> str:
    """The lower-case scheme of ``url``; ``""`` for a plain local path."""
    match = _SCHEME.match(url)
    return match.group(1).lower() if match else ""


def register(scheme: str, factory: Factory) -> None:
    """Serve ``scheme://`` URLs with ``factory(options, events)``."""
    _FACTORIES[scheme.lower()] = factory


def storage_class(url: str) -> Factory:
    """The factory for ``url``'s scheme.

    Raises:
        ConfigError: no backend handles the scheme.
    """
    scheme = scheme_of(url)
    try:
        return _FACTORIES[scheme]
    except KeyError:
        known = ", ".join(f"{s}://" for s in sorted(_FACTORIES) if s)
        raise ConfigError(f"remote {url!r}: unsupported scheme {scheme!r}; use a local path or {known}") from None


def join_url(root: str, *parts: str | None) -> str:
    """Join path components under a remote root or local directory (``None`` parts skipped)."""
    rest = [p.strip("/") for p in parts if p]
    if not rest:
        return root
    if scheme_of(root):
        return root.rstrip("/") + "/" + "/".join(rest)
    return posixpath.join(root, *rest)


class StoragePool:
    """One backend instance per scheme, made on first use and closed together."""

    def __init__(self, options: StorageOptions | None = None, events: TransferEvents | None = None) -> None:
        self.options = options or StorageOptions()
        self.events = events
        self._storages: dict[str, Storage] = {}
        self._closed = False

    def get(self, url: str) -> Storage:
        """The backend for ``url`` (created on first use)."""
        scheme = scheme_of(url)
        key = "file" if scheme == "" else ("http" if scheme == "https" else scheme)
        storage = self._storages.get(key)
        if storage is None:
            storage = storage_class(url)(self.options, self.events)
            self._storages[key] = storage
        return storage

    async def aclose(self) -> None:
        """Close every backend; idempotent."""
        self._closed = True
        storages, self._storages = list(self._storages.values()), {}
        for storage in storages:
            await storage.aclose()

    async def __aenter__(self) -> StoragePool:
        return self

    async def __aexit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        await self.aclose()
