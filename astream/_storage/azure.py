"""``azure://container/blob`` remotes: Azure Blob Storage (the optional extra ``azure``).

azure-storage-blob's async client, on an aiohttp session of astream's own. Its retry
policy (waits of 15-24 s) is switched off (``retry_total=0``): astream's
:class:`RetryPolicy` decides, as for every scheme; 503 ServerBusy and 429 count as
throttling, ``Retry-After`` is honoured. Reads are ranged GETs of at most
``chunk_size`` bytes each streamed into the sink (never a whole blob in memory); a cut
transfer resumes at the byte it reached, guarded by the blob's ETag.

Credentials, first found wins: ``storage_options`` (``connection_string``;
``account_name`` with ``account_key`` or ``sas_token``; ``anonymous=True`` for a public
container), ``AZURE_STORAGE_CONNECTION_STRING``, MosaicML's ``AZURE_ACCOUNT_NAME`` with
``AZURE_ACCOUNT_ACCESS_KEY``, and ``DefaultAzureCredential`` when azure-identity is
installed. ``endpoint_url`` overrides ``https://<account>.blob.core.windows.net``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
from typing import Any
from urllib.parse import urlsplit

import aiohttp

from astream._storage.base import (
    ObjectInfo,
    Storage,
    StorageOptions,
    TransferEvents,
    Transient,
    check_body_length,
    check_range,
    check_remote_size,
    range_past_end,
    with_retries,
)
from astream._storage.http import status_error
from astream._storage.sink import Sink
from astream.errors import AccessDeniedError, ConfigError, DownloadError, MissingExtraError, UsageError

__all__ = ["AzureStorage", "split_azure_url"]

_HINT = (
    "set AZURE_STORAGE_CONNECTION_STRING, or AZURE_ACCOUNT_NAME and AZURE_ACCOUNT_ACCESS_KEY "
    "(or install azure-identity for DefaultAzureCredential); a public container: storage_options={'anonymous': True}"
)


def split_azure_url(url: str) -> tuple[str, str]:
    """``azure://container/a/b`` -> ``("container", "a/b")``."""
    parts = urlsplit(url)
    if parts.scheme not in ("azure", "az") or not parts.netloc:
        raise UsageError(f"{url!r} is not an azure://container/blob URL")
    return parts.netloc, parts.path.lstrip("/")


def _import_azure() -> tuple[Any, Any, Any, Any]:
    try:
        from azure.core import MatchConditions, exceptions
        from azure.core.pipeline.transport import AioHttpTransport
        from azure.storage.blob.aio import BlobServiceClient
    except ImportError as exc:
        raise MissingExtraError("azure:// remotes", "azure", "azure-storage-blob") from exc
    return BlobServiceClient, AioHttpTransport, exceptions, MatchConditions


class AzureStorage(Storage):
    """A remote in an Azure Blob Storage container."""

    schemes = ("azure",)
    option_keys = frozenset(
        {"account_name", "account_key", "connection_string", "sas_token", "endpoint_url", "anonymous", "credential"}
    )

    def __init__(self, options: StorageOptions | None = None, events: TransferEvents | None = None) -> None:
        super().__init__(options, events)
        self._Service, self._Transport, self._exc, self._Match = _import_azure()
        self.options.remote.check("azure://", self.option_keys)
        self._service: Any = None
        self._session: aiohttp.ClientSession | None = None
        self._credential: Any = None
        self._etags: dict[str, str] = {}

    # -- the client ------------------------------------------------------------------------------
    def _client_kwargs(self) -> dict[str, Any]:
        opts = self.options
        block = max(1 << 20, opts.chunk_size)
        return {
            "transport": self._Transport(session=self._session, session_owner=False),
            "retry_total": 0,  # astream's RetryPolicy decides
            "connection_timeout": opts.timeouts.connect,
            "read_timeout": opts.timeouts.download,
            "max_single_get_size": block,
            "max_chunk_get_size": block,
            "max_single_put_size": 4 * block,
            "max_block_size": 4 * block,
        }

    def _make_service(self) -> Any:
        config, where = self.options.remote, "azure://"
        kwargs = self._client_kwargs()
        conn = config.text("connection_string", where) or os.environ.get("AZURE_STORAGE_CONNECTION_STRING")
        account = config.text("account_name", where) or os.environ.get("AZURE_ACCOUNT_NAME")
        endpoint = config.text("endpoint_url", where)
        if conn and not config.text("account_name", where):
            return self._Service.from_connection_string(conn, **kwargs)
        if not account and not endpoint:
            raise AccessDeniedError(f"azure://: no storage account given; {_HINT}")
        url = endpoint or f"https://{account}.blob.core.windows.net"
        credential: Any = None
        key = config.text("account_key", where) or (None if config.get("account_name") else os.environ.get("AZURE_ACCOUNT_ACCESS_KEY"))
        if config.flag("anonymous", where):
            credential = None
        elif key:
            credential = {"account_name": account, "account_key": key}
        elif config.text("sas_token", where):
            credential = config.text("sas_token", where)
        elif config.get("credential") is not None:
            raise ConfigError("storage_options for azure://: credential objects are not picklable; use sas_token or account_key")
        else:
            with contextlib.suppress(ImportError):
                from azure.identity.aio import DefaultAzureCredential

                credential = self._credential = DefaultAzureCredential()
        return self._Service(account_url=url, credential=credential, **kwargs)

    def _blob(self, url: str) -> Any:
        if self._closed:
            raise UsageError("this AzureStorage is closed")
        if self._service is None:
            self._session = aiohttp.ClientSession(
                connector=aiohttp.TCPConnector(limit=self.options.max_connections), auto_decompress=False
            )
            self._needs_close = True
            self._service = self._make_service()
        container, name = split_azure_url(url)
        return self._service.get_blob_client(container, name)

    # -- errors --------------------------------------------------------------------------------------
    def _translate(self, url: str, exc: BaseException, verb: str = "download") -> Exception:
        exc_mod = self._exc
        if isinstance(exc, exc_mod.ResourceModifiedError):
            self._etags.pop(url, None)
            return Transient("the blob changed while we resumed; restarting")
        if isinstance(exc, exc_mod.HttpResponseError) and exc.status_code:
            response = getattr(exc, "response", None)
            headers = getattr(response, "headers", {}) or {}
            if exc.status_code == 416:
                self._etags.pop(url, None)
                return Transient("HTTP 416: the blob shrank while we resumed; restarting")
            return status_error(url, int(exc.status_code), str(getattr(exc, "reason", "") or ""), headers, verb, _HINT)
        if isinstance(exc, exc_mod.ClientAuthenticationError):
            return AccessDeniedError(f"{url}: {exc}; {_HINT}")
        if isinstance(exc, (exc_mod.ServiceRequestError, exc_mod.ServiceResponseError, exc_mod.IncompleteReadError,
                            aiohttp.ClientError, ConnectionError, asyncio.IncompleteReadError)):
            return Transient(f"{type(exc).__name__}: {exc}")
        if isinstance(exc, exc_mod.AzureError):
            return DownloadError(f"{url}: {type(exc).__name__}: {exc}")
        raise exc

    async def _call(self, url: str, fn: Any, verb: str = "download") -> Any:
        try:
            return await fn()
        except (Transient, DownloadError):
            raise
        except Exception as exc:
            raise self._translate(url, exc, verb) from exc

    # -- the protocol ------------------------------------------------------------------------------
    async def fetch_into(
        self, url: str, sink: Sink, *, size: int | None = None, events: TransferEvents | None = None
    ) -> None:
        ev = events or self.events
        blob = self._blob(url)

        async def attempt(n: int) -> None:
            offset = sink.received
            etag = self._etags.get(url)
            kwargs: dict[str, Any] = {"max_concurrency": 1}
            if offset and etag:
                kwargs.update(offset=offset, etag=etag, match_condition=self._Match.IfNotModified)
            elif offset:
                await sink.restart()
                offset = 0

            async def go() -> int:
                if offset and size is not None and offset >= size:
                    return offset  # everything arrived; the last attempt only missed its check
                downloader = await blob.download_blob(**kwargs)
                total = offset + int(downloader.size)
                check_remote_size(url, total, size)
                if downloader.properties.etag:
                    self._etags[url] = downloader.properties.etag
                async for data in downloader.chunks():
                    ev.on_bytes(len(data))
                    await sink.write(data)
                return total

            total = await self._call(url, go)
            if sink.received != total:
                raise Transient(f"the body ended after {sink.received} of {total} bytes")

        try:
            await with_retries(url, attempt, self.options, ev)
        finally:
            self._etags.pop(url, None)

    async def read_bytes(self, url: str) -> bytes:
        blob = self._blob(url)

        async def attempt(n: int) -> bytes:
            async def go() -> bytes:
                downloader = await blob.download_blob(max_concurrency=1)
                return bytes(await downloader.readall())

            return await self._call(url, go)  # type: ignore[no-any-return]

        return await with_retries(url, attempt, self.options, self.events)

    async def read_range(self, url: str, start: int, end: int) -> bytes:
        start, end = check_range(url, start, end)
        if start == end:
            return b""
        blob = self._blob(url)
        length = end - start

        async def attempt(n: int) -> bytes:
            async def go() -> bytes:
                try:
                    downloader = await blob.download_blob(offset=start, length=length, max_concurrency=1)
                except self._exc.HttpResponseError as exc:
                    if exc.status_code == 416:  # the range starts at or past the end
                        raise range_past_end(url, None, start, end) from exc
                    raise
                return bytes(await downloader.readall())

            data = await self._call(url, go)
            if len(data) < length and n == 0:
                # Azure clamps a range that runs past the end: the object is shorter than asked.
                props = await self._call(url, blob.get_blob_properties)
                if props.size is not None and int(props.size) < end:
                    raise range_past_end(url, int(props.size), start, end)
            return check_body_length(url, data, start, length)

        return await with_retries(url, attempt, self.options, self.events)

    async def exists(self, url: str) -> bool:
        blob = self._blob(url)

        async def attempt(n: int) -> bool:
            return bool(await self._call(url, blob.exists))

        return await with_retries(url, attempt, self.options, self.events)

    async def stat(self, url: str) -> ObjectInfo:
        blob = self._blob(url)

        async def attempt(n: int) -> ObjectInfo:
            props = await self._call(url, blob.get_blob_properties)
            return ObjectInfo(int(props.size), props.etag)

        return await with_retries(url, attempt, self.options, self.events)

    async def put(self, local_path: str, url: str) -> None:
        blob = self._blob(url)
        length = (await asyncio.get_running_loop().run_in_executor(None, os.stat, local_path)).st_size

        async def attempt(n: int) -> None:
            async def go() -> None:
                with open(local_path, "rb") as fh:  # noqa: ASYNC230 - the SDK reads it block by block
                    await blob.upload_blob(fh, length=length, overwrite=True, max_concurrency=2)

            await self._call(url, go, "upload")

        await with_retries(url, attempt, self.options, self.events, verb="upload")

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        service, self._service = self._service, None
        session, self._session = self._session, None
        credential, self._credential = self._credential, None
        with contextlib.suppress(Exception):
            if service is not None:
                await asyncio.shield(service.close())
            if credential is not None:
                await asyncio.shield(credential.close())
        if session is not None:
            await asyncio.shield(session.close())
