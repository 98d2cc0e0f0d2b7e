"""Which backend serves a URL, and a per-loop pool that owns one instance per remote.

``storage_class(url)`` picks the factory by scheme (a plain path is local). A
:class:`StoragePool` is what the cache engine holds: it creates each backend once per
scheme and ``storage_options``, lazily, on the loop that uses it (so one aiohttp
session per loop), and closes them together.

New schemes are added with :func:`register` (public as ``astream.register_storage``)
or by an installed package through the entry-point group ``astream.storage``: the
entry point's name is the scheme, its object the factory. Each scheme declares the
``storage_options`` keys it reads, and :func:`configure` refuses any other.
"""

from __future__ import annotations

import importlib.metadata
import logging
import posixpath
import re
import urllib.parse
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, replace
from typing import Any

from astream._resource import AsyncResource
from astream._storage.base import Storage, StorageOptions, TransferEvents
from astream._storage.config import RemoteConfig
from astream._storage.local import LocalStorage
from astream._storage.retry import RetryPolicy, Timeouts
from astream.errors import ConfigError

__all__ = [
    "ENTRY_POINT_GROUP",
    "StoragePool",
    "configure",
    "join_url",
    "known_schemes",
    "register",
    "scheme_of",
    "storage_class",
    "transfer_options",
]

log = logging.getLogger("astream")

Factory = Callable[[StorageOptions, TransferEvents | None], Storage]
ENTRY_POINT_GROUP = "astream.storage"

_SCHEME = re.compile(r"^([a-zA-Z][a-zA-Z0-9+.-]*)://")


@dataclass(frozen=True)
class _Entry:
    factory: Factory
    keys: frozenset[str]
    extra: str | None = None


def _lazy(module: str, name: str) -> Factory:
    # aiohttp costs ~0.1 s to import, paid by every process (workers too), and the cloud
    # SDKs are optional extras: import a backend only in processes that use it.
    def factory(options: StorageOptions, events: TransferEvents | None) -> Storage:
        cls = getattr(importlib.import_module(module), name)
        return cls(options, events)  # type: ignore[no-any-return]

    factory.__qualname__ = factory.__name__ = f"{name}_factory"
    return factory


_HTTP_KEYS = frozenset({"headers", "ca_bundle", "verify_ssl"})
_S3_KEYS = frozenset(
    {"endpoint_url", "region", "key", "secret", "token", "profile", "anonymous", "requester_pays", "ca_bundle"}
)
_GCS_KEYS = frozenset({"endpoint_url", "anonymous", "service_file", "token", "hmac_key", "hmac_secret", "project"})
_AZURE_KEYS = frozenset(
    {"account_name", "account_key", "connection_string", "sas_token", "endpoint_url", "anonymous", "credential",
     "ca_bundle"}
)
_HF_KEYS = frozenset({"token", "endpoint", "headers", "ca_bundle"})

_HTTP = _Entry(_lazy("astream._storage.http", "HttpStorage"), _HTTP_KEYS)  # one session for both
_LOCAL = _Entry(LocalStorage, frozenset())
_BUILTIN: dict[str, _Entry] = {
    "": _LOCAL,
    "file": _LOCAL,
    "http": _HTTP,
    "https": _HTTP,
    "s3": _Entry(_lazy("astream._storage.s3", "S3Storage"), _S3_KEYS, "s3"),
    "gs": _Entry(_lazy("astream._storage.gcs", "gcs_storage"), _GCS_KEYS, "gcs"),
    "azure": _Entry(_lazy("astream._storage.azure", "AzureStorage"), _AZURE_KEYS, "azure"),
    "hf": _Entry(_lazy("astream._storage.hf", "HfStorage"), _HF_KEYS),
}
_FACTORIES: dict[str, _Entry] = dict(_BUILTIN)
# Schemes other tools use for the same remotes (fsspec's gcs://, az://).
_ALIASES = {"gcs": "gs", "az": "azure"}
_entry_points_loaded = False


def scheme_of(url: str) -> str:
    """The lower-case scheme of ``url``; ``""`` for a plain local path."""
    match = _SCHEME.match(url)
    return match.group(1).lower() if match else ""


def register(scheme: str, factory: Factory, *, option_keys: Iterable[str] | None = None) -> None:
    """Serve ``scheme://`` URLs with ``factory(options, events)`` (public as ``astream.register_storage``).

    Args:
        scheme: the URL scheme, without ``://`` (case-insensitive).
        factory: a :class:`Storage` subclass or a callable ``(StorageOptions, TransferEvents | None)``
            returning a :class:`Storage`; it reads its ``storage_options`` from ``options.remote``.
        option_keys: the ``storage_options`` keys the backend reads (default: the factory's
            ``option_keys`` attribute, else none); any other key is refused.

    Raises:
        ConfigError: an invalid scheme or a factory that is not callable.
    """
    if not isinstance(scheme, str) or not re.fullmatch(r"[a-zA-Z][a-zA-Z0-9+.-]*", scheme):
        raise ConfigError(f"register_storage: {scheme!r} is not a URL scheme (letters, digits, + . -; no ://)")
    if not callable(factory):
        raise ConfigError(f"register_storage({scheme!r}): the factory must be callable, got {factory!r}")
    keys = option_keys if option_keys is not None else getattr(factory, "option_keys", ())
    _FACTORIES[scheme.lower()] = _Entry(factory, frozenset(keys))


def _load_entry_points() -> None:
    global _entry_points_loaded
    if _entry_points_loaded:
        return
    _entry_points_loaded = True
    for ep in importlib.metadata.entry_points(group=ENTRY_POINT_GROUP):
        if ep.name.lower() in _FACTORIES:
            continue  # registered in code (or built in): that one wins
        try:
            register(ep.name, ep.load())
        except Exception as exc:  # a broken plug-in must not break the other schemes
            log.warning("astream: the storage entry point %r (%s) failed to load: %s", ep.name, ep.value, exc)


def _entry(url: str) -> _Entry:
    _refuse_credentials(url)
    scheme = scheme_of(url)
    scheme = _ALIASES.get(scheme, scheme)
    entry = _FACTORIES.get(scheme)
    if entry is None:
        _load_entry_points()
        entry = _FACTORIES.get(scheme)
    if entry is None:
        raise ConfigError(f"remote {url!r}: unsupported scheme {scheme_of(url)!r}; {known_schemes()}")
    return entry


def _refuse_credentials(url: str) -> None:
    """A URL is named in messages, logs and metrics: it must not carry a secret (``user:pw@``).

    Raises:
        ConfigError: the URL has a user or password part (the message shows neither).
    """
    parts = urllib.parse.urlsplit(url)
    if parts.scheme and "@" in parts.netloc:
        shown = parts._replace(netloc=parts.netloc.rpartition("@")[2]).geturl()
        raise ConfigError(
            f"remote {shown!r} carries credentials in its URL (user:password@); astream names URLs in messages, "
            "logs and metrics: give them in storage_options instead (headers={'Authorization': ...}, or the "
            "backend's key and secret)"
        )


def known_schemes() -> str:
    """A sentence listing the schemes astream can read and the extra each needs."""
    _load_entry_points()
    names = []
    for s in sorted(_FACTORIES):
        if s:
            extra = _FACTORIES[s].extra
            names.append(f"{s}://" + (f" (pip install 'astream[{extra}]')" if extra else ""))
    return (
        f"use a local path or one of {', '.join(names)}; a package adds others with "
        f"astream.register_storage() or the entry-point group {ENTRY_POINT_GROUP!r}"
    )


def storage_class(url: str) -> Factory:
    """The factory for ``url``'s scheme.

    Raises:
        ConfigError: no backend handles the scheme (the message lists those that do).
    """
    return _entry(url).factory


def configure(
    url: str, storage_options: Mapping[str, Any] | RemoteConfig | None, base: StorageOptions | None = None
) -> StorageOptions:
    """``base`` with the ``storage_options`` of the remote ``url``, checked against its scheme.

    ``timeout`` and ``connect_timeout`` set the per-attempt timeouts; the other keys are
    left in ``options.remote`` for the backend.

    Raises:
        ConfigError: an unknown scheme, an option key the scheme does not read, a bad value.
    """
    base = base or StorageOptions()
    config = RemoteConfig.of(storage_options)
    if not config:
        return base
    config.check(url, _entry(url).keys)
    timeouts = base.timeouts
    if config.get("timeout") is not None or config.get("connect_timeout") is not None:
        timeouts = Timeouts(
            download=config.get("timeout", timeouts.download), connect=config.get("connect_timeout", timeouts.connect)
        )
    return replace(base, timeouts=timeouts, remote=config)


def transfer_options(
    remote: str | None, storage_options: Mapping[str, Any] | RemoteConfig | None, *, timeout: float, retries: int,
) -> StorageOptions:
    """The transfer settings of one remote: its ``download_timeout`` and ``download_retry``,
    then its ``storage_options`` (see :func:`configure`). The one derivation, shared by the
    node's engine and the dataset's ranged reader, so both talk to a remote alike.

    Raises:
        ConfigError: as :func:`configure`.
    """
    options = StorageOptions(timeouts=Timeouts(download=timeout), retry=RetryPolicy(retries=retries))
    return options if remote is None else configure(remote, storage_options, options)


def join_url(root: str, *parts: str | None) -> str:
    """Join path components under a remote root or local directory (``None`` parts skipped)."""
    rest = [p.strip("/") for p in parts if p]
    if not rest:
        return root
    if scheme_of(root):
        return root.rstrip("/") + "/" + "/".join(rest)
    return posixpath.join(root, *rest)


class StoragePool(AsyncResource):
    """One backend instance per scheme and ``storage_options``, made on first use and closed together."""

    def __init__(self, options: StorageOptions | None = None, events: TransferEvents | None = None) -> None:
        self.options = options or StorageOptions()
        self.events = events
        self._storages: dict[tuple[Factory, RemoteConfig], Storage] = {}
        self._closed = False

    def get(self, url: str, remote: RemoteConfig | None = None) -> Storage:
        """The backend for ``url`` (created on first use).

        Args:
            url: the remote object or root.
            remote: that remote's ``storage_options`` (default: the pool's ``options.remote``).
        """
        entry = _entry(url)
        config = self.options.remote if remote is None else remote
        key = (entry.factory, config)
        storage = self._storages.get(key)
        if storage is None:
            options = self.options if config == self.options.remote else replace(self.options, remote=config)
            storage = entry.factory(options, self.events)
            self._storages[key] = storage
        return storage

    async def aclose(self) -> None:
        """Close every backend; idempotent."""
        self._closed = True
        storages, self._storages = list(self._storages.values()), {}
        for storage in storages:
            await storage.aclose()

