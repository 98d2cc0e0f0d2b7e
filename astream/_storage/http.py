"""``http://`` and ``https://`` remotes with aiohttp.

One :class:`aiohttp.ClientSession` per storage (and a storage per event loop), with a
pooled connector, ``auto_decompress`` off (shards are stored compressed on purpose),
and bodies streamed to a sink in chunks. Connection errors, timeouts, 5xx and 429 are
retried with back-off, honouring ``Retry-After``; other 4xx fail at once. A transfer
cut short resumes with ``Range: bytes=N-`` guarded by ``If-Range: <ETag>``, and is
restarted from byte 0 if the server ignores the range or the object changed.

``storage_options``: ``headers`` (sent with every request, e.g. ``Authorization``),
``ca_bundle`` (a PEM file of the CAs to trust, for a private CA), ``verify_ssl``.
Backends that are HTTP underneath (``gs://``, ``hf://``) subclass this one and
override :meth:`HttpStorage._request` to map their URLs and add credentials.
"""

from __future__ import annotations

import asyncio
import os
import re
import ssl
from collections.abc import AsyncIterator
from typing import Any

import aiohttp
import yarl

from astream._storage.answers import (
    CONTENT_RANGE,
    check_body_length,
    check_content_range,
    check_range,
    check_remote_size,
    range_past_end,
)
from astream._storage.base import (
    ObjectInfo,
    Storage,
    StorageOptions,
    TransferEvents,
    Transient,
    with_retries,
)
from astream._storage.retry import parse_retry_after
from astream._storage.sink import Sink
from astream.errors import (
    AccessDeniedError,
    ConfigError,
    DownloadError,
    RangeNotSupportedError,
    RemoteNotFoundError,
    UploadError,
    UsageError,
)

__all__ = ["HttpStorage"]

# What a 416 carries: the size of the object, whose end the range ran past.
_UNSATISFIED_RANGE = re.compile(r"^\s*bytes\s+\*/(\d+)\s*$")
_THROTTLE = {429, 503}
# Network-level failures that another attempt may fix (DNS failure included: resolvers flap).
_NETWORK_ERRORS = (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError, ConnectionError)


def status_error(url: str, status: int, reason: str, headers: object, verb: str = "download", hint: str = "") -> Exception:
    """The error (or :class:`Transient`) for an HTTP answer ``status`` to a request for ``url``.

    Args:
        url: the object, for the message.
        status: the HTTP status.
        reason: its reason phrase.
        headers: the answer's headers (``Retry-After`` is read from them).
        verb: ``"download"`` or ``"upload"``.
        hint: what to set when the remote refuses the credentials (401/403).
    """
    retry_after = parse_retry_after(headers.get("Retry-After")) if hasattr(headers, "get") else None
    what = f"HTTP {status} {reason or ''}".rstrip()
    if status in _THROTTLE:
        return Transient(f"{what} (server is throttling)", retry_after=retry_after, throttled=True)
    if status >= 500 or status == 408:
        return Transient(what, retry_after=retry_after)
    denied = f"; {hint}" if status in (401, 403) and hint else ""
    if verb == "upload":
        return UploadError(f"{url}: upload refused with {what}{denied}; not retried")
    if status in (404, 410):
        return RemoteNotFoundError(f"{url}: {what}; check the remote URL and the split")
    if status in (401, 403):
        return AccessDeniedError(f"{url}: {what}{denied or '; check the credentials'}; not retried")
    return DownloadError(f"{url}: {what}; not retried")


def ssl_context(url: str, ca_bundle: str | None, verify: bool) -> ssl.SSLContext | bool:
    """What aiohttp's ``ssl=`` gets: the default checks, a private CA bundle, or none.

    Raises:
        ConfigError: the CA bundle cannot be read.
    """
    if not verify:
        return False
    if ca_bundle is None:
        return True
    try:
        return ssl.create_default_context(cafile=ca_bundle)
    except (OSError, ssl.SSLError) as exc:
        raise ConfigError(f"storage_options for {url!r}: ca_bundle {ca_bundle!r} is not a readable PEM file: {exc}") from exc


class HttpStorage(Storage):
    """A remote served over HTTP(S): any static file server, CDN or presigned bucket URL."""

    schemes: tuple[str, ...] = ("http", "https")
    option_keys = frozenset({"headers", "ca_bundle", "verify_ssl"})
    #: What a refused request (401/403) tells the user to set.
    credentials_hint = "pass the credentials in storage_options={'headers': {'Authorization': ...}}"

    def __init__(
        self,
        options: StorageOptions | None = None,
        events: TransferEvents | None = None,
        *,
        session: aiohttp.ClientSession | None = None,
    ) -> None:
        super().__init__(options, events)
        self._session = session
        self._owns_session = session is None
        self._loop: asyncio.AbstractEventLoop | None = None
        # Validators seen per URL, so a retry can resume only the same version of an object.
        self._etags: dict[str, str] = {}
        where = self.schemes[0] + "://"
        config = self.options.remote
        config.check(where, self.option_keys)
        self._headers = config.headers(where) if "headers" in self.option_keys else {}
        self._home: set[yarl.URL] = set()  # origins astream asked for: credentials go there only
        self._ours: set[str] = set()  # the names of the headers it adds
        self._ssl = ssl_context(where, config.text("ca_bundle", where), config.flag("verify_ssl", where, True))

    async def _prepare(self, url: str) -> tuple[str, dict[str, str]]:
        """:meth:`_request`, noting the origin asked and the headers sent to it."""
        target, headers = await self._request(url)
        self._home.add(yarl.URL(target).origin())
        self._ours.update(headers)
        return target, headers

    async def _credentials_stay_home(
        self, req: aiohttp.ClientRequest, handler: aiohttp.ClientHandlerType
    ) -> aiohttp.ClientResponse:
        # Every hop of a redirect comes here: one to an origin astream did not ask for (a
        # CDN, another host) gets none of the headers added for the remote. aiohttp drops
        # Authorization and Cookie itself, not X-Api-Key or any other credential header.
        if req.url.origin() not in self._home:
            for name in self._ours:
                req.headers.popall(name, None)
        return await handler(req)

    def _middlewares(self, session: aiohttp.ClientSession) -> tuple[Any, ...]:
        # Per request, so an injected session gets it too (after its own middlewares).
        return (*getattr(session, "_middlewares", ()), self._credentials_stay_home)

    async def _request(self, url: str) -> tuple[str, dict[str, str]]:
        """The HTTP(S) URL to ask for ``url`` and the headers of every request for it.

        Subclasses whose URLs are not HTTP URLs (``gs://``, ``hf://``) map them here and add
        their credentials; a plain HTTP remote adds the ``headers`` option.
        """
        return url, self._headers

    def _error(self, url: str, resp: aiohttp.ClientResponse, verb: str = "download") -> Exception:
        return status_error(url, resp.status, resp.reason or "", resp.headers, verb, self.credentials_hint)

    def _get_session(self) -> aiohttp.ClientSession:
        loop = asyncio.get_running_loop()
        if self._closed:
            raise UsageError("this HttpStorage is closed")
        if self._loop is None:
            self._loop = loop
        elif self._loop is not loop:
            raise UsageError("an HttpStorage is bound to the event loop that first used it; make one per loop")
        if self._session is None:
            opts = self.options
            connector = aiohttp.TCPConnector(limit=opts.max_connections, ttl_dns_cache=300, ssl=self._ssl)
            timeout = aiohttp.ClientTimeout(
                total=None, connect=opts.timeouts.connect, sock_connect=opts.timeouts.connect
            )
            self._session = aiohttp.ClientSession(
                connector=connector, timeout=timeout, auto_decompress=False, raise_for_status=False,
                read_bufsize=max(1 << 16, opts.chunk_size),
            )
            self._needs_close = True
        return self._session

    async def fetch_into(
        self, url: str, sink: Sink, *, size: int | None = None, events: TransferEvents | None = None
    ) -> None:
        ev = events or self.events
        session = self._get_session()

        target, base = await self._prepare(url)

        async def attempt(n: int) -> None:
            headers = dict(base)
            offset = sink.received
            etag = self._etags.get(url)
            if offset and (etag or size is not None):
                # Resume; If-Range makes the server send the whole object if it changed, and
                # without an ETag the Content-Range total is checked against index.json's size.
                headers["Range"] = f"bytes={offset}-"
                if etag:
                    headers["If-Range"] = etag
            elif offset:
                await sink.restart()
                offset = 0
            try:
                async with session.get(target, headers=headers, middlewares=self._middlewares(session)) as resp:
                    total = self._check_response(url, resp, offset, size)
                    if resp.status == 200 and sink.received:
                        await sink.restart()  # the server sent the whole object again
                    tag = resp.headers.get("ETag")
                    if tag and not tag.startswith("W/"):
                        self._etags[url] = tag
                    # The pieces as the socket delivered them (up to read_bufsize), without
                    # joining them into chunk_size blocks: one copy of every byte fewer.
                    async for data, _ in resp.content.iter_chunks():
                        ev.on_bytes(len(data))
                        await sink.write(data)
            except _NETWORK_ERRORS as exc:
                raise Transient(f"{type(exc).__name__}: {exc or 'connection lost'}") from exc
            if sink.received != total:
                raise Transient(f"the body ended after {sink.received} of {total} bytes")

        try:
            await with_retries(url, attempt, self.options, ev)
        finally:
            self._etags.pop(url, None)

    def _check_response(self, url: str, resp: aiohttp.ClientResponse, offset: int, size: int | None) -> int:
        """Validate status and sizes; returns the full size of the object."""
        if resp.status == 206:
            match = CONTENT_RANGE.match(resp.headers.get("Content-Range", ""))
            if not match or int(match.group(1)) != offset or match.group(3) == "*":
                self._etags.pop(url, None)
                raise Transient(f"unusable Content-Range {resp.headers.get('Content-Range')!r}; restarting")
            total = int(match.group(3))
        elif resp.status == 200:
            total = resp.content_length if resp.content_length is not None else -1
        elif resp.status == 416:
            self._etags.pop(url, None)
            raise Transient("HTTP 416: the object shrank while we resumed; restarting")
        else:
            raise self._error(url, resp)
        if total < 0:
            total = size if size is not None else -1
        check_remote_size(url, total, size)
        return total

    async def read_bytes(self, url: str) -> bytes:
        session = self._get_session()
        target, headers = await self._prepare(url)

        async def attempt(n: int) -> bytes:
            try:
                async with session.get(target, headers=headers, middlewares=self._middlewares(session)) as resp:
                    if resp.status != 200:
                        raise self._error(url, resp)
                    return await resp.read()
            except _NETWORK_ERRORS as exc:
                raise Transient(f"{type(exc).__name__}: {exc or 'connection lost'}") from exc

        return await with_retries(url, attempt, self.options, self.events)

    async def read_range(self, url: str, start: int, end: int) -> bytes:
        start, end = check_range(url, start, end)
        if start == end:
            return b""
        session = self._get_session()
        length = end - start
        target, base = await self._prepare(url)
        headers = {**base, "Range": f"bytes={start}-{end - 1}"}

        async def attempt(n: int) -> bytes:
            try:
                async with session.get(target, headers=headers, middlewares=self._middlewares(session)) as resp:
                    if resp.status == 200:
                        # The server ignores ranges and is sending the whole object: drop the
                        # connection rather than drain a shard we did not ask for.
                        resp.close()
                        raise RangeNotSupportedError(
                            f"{url}: the server answered a Range request with the whole object (HTTP 200); "
                            "it does not serve byte ranges"
                        )
                    if resp.status == 416:
                        match = _UNSATISFIED_RANGE.match(resp.headers.get("Content-Range", ""))
                        raise range_past_end(url, int(match.group(1)) if match else None, start, end)
                    if resp.status != 206:
                        raise self._error(url, resp)
                    check_content_range(url, resp.headers.get("Content-Range"), start, end)
                    if resp.content_length is not None and resp.content_length != length:
                        resp.close()
                        raise DownloadError(
                            f"{url}: asked for {length} bytes at {start} but the answer is "
                            f"{resp.content_length} bytes long; not retried"
                        )
                    data = await resp.read()
            except _NETWORK_ERRORS as exc:
                raise Transient(f"{type(exc).__name__}: {exc or 'connection lost'}") from exc
            return check_body_length(url, data, start, length)

        return await with_retries(url, attempt, self.options, self.events)

    async def _head(self, url: str) -> ObjectInfo | None:
        """The object's size and ETag from a HEAD request; None when there is no such object."""
        session = self._get_session()
        target, headers = await self._prepare(url)

        async def attempt(n: int) -> ObjectInfo | None:
            try:
                async with session.head(target, headers=headers, allow_redirects=True,
                                        middlewares=self._middlewares(session)) as resp:
                    if resp.status in (404, 410):
                        return None
                    if resp.status < 300:
                        return ObjectInfo(resp.content_length if resp.content_length is not None else -1,
                                          resp.headers.get("ETag"))
                    raise self._error(url, resp)
            except _NETWORK_ERRORS as exc:
                raise Transient(f"{type(exc).__name__}: {exc or 'connection lost'}") from exc

        return await with_retries(url, attempt, self.options, self.events)

    async def exists(self, url: str) -> bool:
        return await self._head(url) is not None

    async def stat(self, url: str) -> ObjectInfo:
        info = await self._head(url)
        if info is None:
            raise RemoteNotFoundError(f"{url}: no such object; check the remote URL and the split")
        if info.size < 0:
            raise DownloadError(f"{url}: the server did not say how long the object is (no Content-Length)")
        return info

    async def put(self, local_path: str, url: str) -> None:
        session = self._get_session()
        target, base = await self._prepare(url)
        chunk = self.options.chunk_size
        length = (await asyncio.get_running_loop().run_in_executor(None, os.stat, local_path)).st_size

        async def body() -> AsyncIterator[bytes]:
            loop = asyncio.get_running_loop()
            with open(local_path, "rb") as fh:  # noqa: ASYNC230 - reads go to the executor below
                while data := await loop.run_in_executor(None, fh.read, chunk):
                    yield data

        async def attempt(n: int) -> None:
            try:
                headers = {**base, "Content-Length": str(length)}
                async with session.put(target, data=body(), headers=headers,
                                       middlewares=self._middlewares(session)) as resp:
                    if resp.status >= 300:
                        raise self._error(url, resp, "upload")
            except _NETWORK_ERRORS as exc:
                raise Transient(f"{type(exc).__name__}: {exc or 'connection lost'}") from exc

        await with_retries(url, attempt, self.options, self.events, verb="upload")

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        session, self._session = self._session, None
        if session is not None and self._owns_session:
            await asyncio.shield(session.close())
