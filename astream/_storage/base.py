"""The storage protocol every backend implements, and the retry loop they share.

(The checks of a remote's answer are in :mod:`.answers`; :class:`Transient`, the failure
worth retrying, in :mod:`.retry`, re-exported here.)

A backend knows how to talk to one kind of remote (local disk, HTTP, S3). It
implements a single attempt of each operation and raises :class:`Transient` for a
failure worth retrying; :func:`with_retries` runs the attempts under the per-attempt
``download`` timeout and the back-off schedule of :class:`RetryPolicy`, and turns the
last failure into a :class:`DownloadError` (or :class:`DownloadTimeout`) that names
the URL, the attempts made and the last cause, chained.
"""

from __future__ import annotations

import abc
import asyncio
import os
from collections.abc import Awaitable, Callable
from concurrent.futures import Executor
from dataclasses import dataclass, field
from typing import Protocol, TypeVar

from astream._checks import check_int
from astream._resource import AsyncResource
from astream._storage.answers import check_range
from astream._storage.config import EMPTY, RemoteConfig
from astream._storage.loop import within
from astream._storage.retry import RetryPolicy, Timeouts, Transient
from astream._storage.sink import FileSink, Sink
from astream.errors import (
    ConfigError,
    DownloadError,
    DownloadTimeout,
    RangeNotSupportedError,
    StorageError,
    UploadError,
)

__all__ = [
    "NO_EVENTS",
    "ObjectInfo",
    "Storage",
    "StorageOptions",
    "TransferEvents",
    "Transient",
    "with_retries",
]

T = TypeVar("T")


@dataclass(frozen=True)
class StorageOptions:
    """Everything a backend needs to know about how to transfer, in one frozen value.

    Attributes:
        timeouts: per-attempt download and connect timeouts.
        retry: the retry policy for transient failures.
        max_connections: connection pool size of HTTP/S3 clients.
        chunk_size: bytes read from a socket or file at a time.
        remote: the remote's own ``storage_options`` (endpoint, credentials, headers...),
            checked against the keys its scheme accepts (see ``registry.configure``).
    """

    timeouts: Timeouts = field(default_factory=Timeouts)
    retry: RetryPolicy = field(default_factory=RetryPolicy)
    max_connections: int = 64
    chunk_size: int = 1 << 20
    remote: RemoteConfig = EMPTY

    def __post_init__(self) -> None:

        if not isinstance(self.timeouts, Timeouts):
            raise ConfigError(f"timeouts must be a Timeouts, got {type(self.timeouts).__name__}")
        if not isinstance(self.retry, RetryPolicy):
            raise ConfigError(f"retry must be a RetryPolicy, got {type(self.retry).__name__}")
        if not isinstance(self.remote, RemoteConfig):
            raise ConfigError(f"remote must be a RemoteConfig, got {type(self.remote).__name__}")
        for name in ("max_connections", "chunk_size"):
            check_int(name, getattr(self, name), 1)


@dataclass(frozen=True)
class ObjectInfo:
    """What a remote says about one object without sending it.

    Attributes:
        size: its length in bytes.
        etag: the remote's version tag (an opaque string), or None where there is none.
    """

    size: int
    etag: str | None = None


class TransferEvents(Protocol):
    """What a backend reports while it works (the cache's stats and throttle listen)."""

    def on_retry(self, url: str, attempt: int, cause: BaseException, throttled: bool) -> None:
        """Attempt ``attempt`` (1-based) failed with ``cause`` and will be retried."""

    def on_bytes(self, count: int) -> None:
        """``count`` more bytes came over the network."""


class _NoEvents:
    def on_retry(self, url: str, attempt: int, cause: BaseException, throttled: bool) -> None:
        pass

    def on_bytes(self, count: int) -> None:
        pass


NO_EVENTS: TransferEvents = _NoEvents()



async def with_retries(
    url: str,
    attempt: Callable[[int], Awaitable[T]],
    options: StorageOptions,
    events: TransferEvents = NO_EVENTS,
    *,
    verb: str = "download",
) -> T:
    """Run ``attempt(n)`` until it succeeds, retrying :class:`Transient` failures and timeouts.

    Args:
        url: the remote object, for messages.
        attempt: one try; receives the 0-based attempt number.
        options: timeouts and retry policy.
        events: told about each retry.
        verb: ``"download"`` or ``"upload"``, which also picks the error class.

    Raises:
        DownloadTimeout: every attempt timed out (downloads).
        DownloadError: the failures were not all timeouts, or one was not transient.
        UploadError: an upload failed for good.
    """
    policy, timeouts = options.retry, options.timeouts
    last: BaseException | None = None
    timed_out = True
    made = 0
    for n in range(policy.attempts):
        made = n + 1
        try:
            return await within(timeouts.download, attempt(n))
        except TimeoutError as exc:
            if isinstance(exc, StorageError):
                raise
            last = exc
            throttled, retry_after = False, None
        except Transient as exc:
            last, timed_out = exc, False
            throttled, retry_after = exc.throttled, exc.retry_after
            if throttled and policy.yield_to_throttle:
                break  # (a hint leaves a throttling remote to the transfer that slows down)
        if n + 1 < policy.attempts:
            events.on_retry(url, n + 1, last, throttled)
            await asyncio.sleep(policy.delay(n, retry_after))
    assert last is not None
    cause = (
        f"timed out after {timeouts.download:g} s (download_timeout)"
        if isinstance(last, TimeoutError)
        else str(last)
    )
    message = (
        f"{url}: {verb} failed after {made} attempt{'s' if made > 1 else ''} "
        f"(download_retry={policy.retries}); last cause: {cause}"
    )
    if verb == "upload":
        raise UploadError(message) from last
    if timed_out:
        raise DownloadTimeout(message) from last
    raise DownloadError(message) from last


class Storage(AsyncResource, abc.ABC):
    """Async access to one kind of remote, addressed by full URLs (or local paths).

    Instances are bound to the event loop that first uses them, are async context
    managers, and close idempotently. Subclasses implement the ``_``-less abstract
    methods for one scheme.
    """

    schemes: tuple[str, ...] = ()
    #: The ``storage_options`` keys this backend reads (``register`` refuses others).
    option_keys: frozenset[str] = frozenset()

    def __init__(self, options: StorageOptions | None = None, events: TransferEvents | None = None) -> None:
        self.options = options or StorageOptions()
        self.events = events or NO_EVENTS
        self._closed = False
        self._needs_close = False

    @abc.abstractmethod
    async def fetch_into(
        self, url: str, sink: Sink, *, size: int | None = None, events: TransferEvents | None = None
    ) -> None:
        """Stream the object at ``url`` into ``sink``, resuming where the sink stands.

        Args:
            url: the remote object.
            sink: receives the body; on a retry the backend resumes at ``sink.received``
                when the remote allows it, else calls ``sink.restart()``.
            size: the size index.json records; a remote of another size is an error.
            events: who hears about retries and bytes of this transfer (default: the
                storage's own listener), so engines sharing one backend keep their own stats.

        Raises:
            RemoteNotFoundError: there is no such object.
            DownloadError: the transfer failed for good (message has URL, attempts, cause).
            DownloadTimeout: every attempt timed out.
        """

    @abc.abstractmethod
    async def read_bytes(self, url: str) -> bytes:
        """The whole object at ``url`` (for small files such as index.json)."""

    async def read_range(self, url: str, start: int, end: int) -> bytes:
        """Bytes ``start:end`` of the object at ``url`` (``end`` exclusive), in one request.

        Used to read a few records of a shard before the whole file has arrived. Retried like
        ``read_bytes`` (the storage's RetryPolicy); ``start == end`` returns b"" without a request.

        Raises:
            ConfigError: ``start < 0`` or ``end < start``.
            RemoteNotFoundError: there is no such object.
            RangeNotSupportedError: this backend or server cannot serve a byte range (the base
                class always raises it; an HTTP server that answers a Range request with 200).
            DownloadError: the object ends before ``end`` or the transfer failed for good.
        """
        # Not abstract: a backend registered with register() before ranged reads existed keeps
        # working, and callers fall back to the whole file on RangeNotSupportedError. It raises
        # even for an empty range, so a caller learns the backend's ability on its first call.
        check_range(url, start, end)
        raise RangeNotSupportedError(
            f"{url}: {type(self).__name__} cannot read a byte range; read the whole object instead"
        )

    @abc.abstractmethod
    async def exists(self, url: str) -> bool:
        """Whether an object exists at ``url``."""

    async def stat(self, url: str) -> ObjectInfo:
        """The size and version tag of the object at ``url`` (one metadata request).

        Raises:
            RemoteNotFoundError: there is no such object.
            UsageError: the backend cannot tell (the base class; backends override it).
        """
        from astream.errors import UsageError

        raise UsageError(f"{url}: {type(self).__name__} cannot report an object's size and etag")

    async def list_objects(self, url: str) -> list[tuple[str, ObjectInfo]]:
        """Every object under the folder or prefix ``url``, by name relative to it (``a/b.parquet``).

        A backend returns its listing through :func:`~astream._format.names.checked_listing`: the names are
        someone else's (a bucket's keys), and the callers join them into cache paths.

        Raises:
            RemoteNotFoundError: there is no such folder (a prefix with no objects is empty).
            IndexFormatError: a name is not a safe relative path (``..``, absolute, NUL).
            UsageError: the backend cannot list (the base class; HTTP servers cannot).
        """
        from astream.errors import UsageError

        raise UsageError(f"{url}: {type(self).__name__} cannot list a folder")

    @abc.abstractmethod
    async def put(self, local_path: str, url: str) -> None:
        """Upload the file ``local_path`` to ``url`` (retried like downloads).

        Raises:
            UploadError: the upload failed for good.
        """

    async def fetch(
        self, url: str, local_path: str, *, size: int | None = None, executor: Executor | None = None,
        limit: int | None = None,
    ) -> int:
        """Download ``url`` to ``local_path`` atomically (temporary file, fsync, rename).

        Args:
            limit: refuse (``DownloadError``) an object of more bytes, as they arrive.

        Returns:
            The number of bytes written. On failure no file (and no temporary) is left.
        """
        folder = os.path.dirname(local_path) or "."
        await asyncio.get_running_loop().run_in_executor(executor, lambda: os.makedirs(folder, exist_ok=True))
        sink = FileSink(local_path, executor, limit=limit, name=url)
        try:
            await self.fetch_into(url, sink, size=size)
            await sink.commit()
        except BaseException:
            sink.abort()
            raise
        return sink.received

    async def aclose(self) -> None:
        """Release connections; idempotent. Injected sessions/clients are left open."""
        self._closed = True

    def _unclosed(self) -> bool:
        return bool(getattr(self, "_needs_close", False) and not getattr(self, "_closed", True))
