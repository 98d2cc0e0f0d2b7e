"""``azure://container/blob`` remotes: Azure Blob Storage (the optional extra ``azure``).

azure-storage-blob's async client (on an aiohttp session of astream's own) holds the
account and credentials and does the uploads, with its own retry policy (waits of
15-24 s) switched off (``retry_total=0``): astream's :class:`RetryPolicy` decides, as for
every scheme. Reads are plain HTTP GETs of the blob's URL through :class:`HttpStorage`,
signed with a short-lived read-only container SAS made locally from the account key
(or carrying the user's SAS, or an OAuth bearer token from azure-identity, or nothing for
a public container): one streamed request per blob, never a whole blob in memory, cut
transfers resumed with ``Range``; 503 ServerBusy and 429 count as throttling and
``Retry-After`` is honoured. (The SDK's own downloader reads 4 MiB ranges, or buffers a
first 32 MiB one in memory, and was 0.4x as fast on Azurite; see docs/bench/remotes.md.)

Credentials, first found wins: ``storage_options`` (``connection_string``;
``account_name`` with ``account_key`` or ``sas_token``; ``anonymous=True`` for a public
container), ``AZURE_STORAGE_CONNECTION_STRING``, MosaicML's ``AZURE_ACCOUNT_NAME`` with
``AZURE_ACCOUNT_ACCESS_KEY``, and ``DefaultAzureCredential`` when azure-identity is
installed (its token fetched under astream's retry policy too). ``endpoint_url``
overrides ``https://<account>.blob.core.windows.net``; ``ca_bundle`` trusts a private CA
(reads and uploads share the session that checks it).
"""

from __future__ import annotations

import asyncio
import contextlib
import datetime
import os
import time
from typing import Any
from urllib.parse import quote, urlsplit

import aiohttp

from astream._storage.base import StorageOptions, TransferEvents, Transient, with_retries
from astream._storage.http import HttpStorage, status_error
from astream.errors import AccessDeniedError, ConfigError, MissingExtraError, UploadError, UsageError

__all__ = ["AzureStorage", "split_azure_url"]

_HINT = (
    "set AZURE_STORAGE_CONNECTION_STRING, or AZURE_ACCOUNT_NAME and AZURE_ACCOUNT_ACCESS_KEY "
    "(or install azure-identity for DefaultAzureCredential); a public container: storage_options={'anonymous': True}"
)
_API_VERSION = "2021-08-06"  # what the bearer-token requests say they speak
_SAS_LIFETIME = 3600.0  # seconds a read SAS is valid; renewed when less than a quarter is left


def split_azure_url(url: str) -> tuple[str, str]:
    """``azure://container/a/b`` -> ``("container", "a/b")``."""
    parts = urlsplit(url)
    if parts.scheme not in ("azure", "az") or not parts.netloc:
        raise UsageError(f"{url!r} is not an azure://container/blob URL")
    return parts.netloc, parts.path.lstrip("/")


def _import_azure() -> tuple[Any, Any, Any, Any]:
    try:
        from azure.core import exceptions
        from azure.core.pipeline.transport import AioHttpTransport
        from azure.storage.blob import generate_container_sas
        from azure.storage.blob.aio import BlobServiceClient
    except ImportError as exc:
        raise MissingExtraError("azure:// remotes", "azure", "azure-storage-blob") from exc
    return BlobServiceClient, AioHttpTransport, exceptions, generate_container_sas


class AzureStorage(HttpStorage):
    """A remote in an Azure Blob Storage container."""

    schemes = ("azure",)
    option_keys = frozenset(
        {"account_name", "account_key", "connection_string", "sas_token", "endpoint_url", "anonymous", "credential",
         "ca_bundle"}
    )
    credentials_hint = _HINT

    def __init__(self, options: StorageOptions | None = None, events: TransferEvents | None = None) -> None:
        super().__init__(options, events)
        self._Service, self._Transport, self._exc, self._container_sas = _import_azure()
        self._service: Any = None
        self._token_credential: Any = None
        self._sas: dict[str, tuple[str, float]] = {}  # container -> (query, valid until)
        self._bearer: tuple[str, float] | None = None

    # -- the SDK client (account, credentials, uploads) ----------------------------------------------
    def _make_service(self) -> Any:
        config, where = self.options.remote, "azure://"
        block = max(4 << 20, self.options.chunk_size)
        kwargs = {
            "transport": self._Transport(session=self._get_session(), session_owner=False),
            "retry_total": 0,  # astream's RetryPolicy decides
            "connection_timeout": self.options.timeouts.connect,
            "read_timeout": self.options.timeouts.download,
            "max_single_put_size": 2 * block,
            "max_block_size": block,
        }
        conn = config.text("connection_string", where) or os.environ.get("AZURE_STORAGE_CONNECTION_STRING")
        account = config.text("account_name", where) or os.environ.get("AZURE_ACCOUNT_NAME")
        endpoint = config.text("endpoint_url", where)
        if conn and not config.text("account_name", where):
            return self._Service.from_connection_string(conn, **kwargs)
        if not account and not endpoint:
            raise AccessDeniedError(f"azure://: no storage account given; {_HINT}")
        url = endpoint or f"https://{account}.blob.core.windows.net"
        credential: Any = None
        key = config.text("account_key", where) or (
            None if config.get("account_name") else os.environ.get("AZURE_ACCOUNT_ACCESS_KEY")
        )
        if config.get("credential") is not None:
            raise ConfigError("storage_options for azure://: credential objects are not picklable; use sas_token or account_key")
        if config.flag("anonymous", where):
            credential = None
        elif key:
            credential = {"account_name": account, "account_key": key}
        elif config.text("sas_token", where):
            credential = config.text("sas_token", where)
        else:
            with contextlib.suppress(ImportError):
                from azure.identity.aio import DefaultAzureCredential

                credential = self._token_credential = DefaultAzureCredential()
        return self._Service(account_url=url, credential=credential, **kwargs)

    def _svc(self) -> Any:
        if self._service is None:
            self._service = self._make_service()
        return self._service

    # -- reads: the blob's URL, signed --------------------------------------------------------------
    async def _request(self, url: str) -> tuple[str, dict[str, str]]:
        container, name = split_azure_url(url)
        service = self._svc()
        base = service.primary_endpoint.split("?", 1)[0].rstrip("/")
        target = f"{base}/{quote(container, safe='')}/{quote(name, safe='/')}"
        credential = service.credential
        key = getattr(credential, "account_key", None)
        if key:
            return f"{target}?{self._read_sas(service.account_name, container, key)}", dict(self._headers)
        query = urlsplit(service.url).query or self.options.remote.text("sas_token", "azure://")
        if query:
            return f"{target}?{query.lstrip('?')}", dict(self._headers)
        if self._token_credential is not None:
            return target, {**self._headers, "Authorization": f"Bearer {await self._token()}",
                            "x-ms-version": _API_VERSION}
        return target, dict(self._headers)  # a public container

    def _read_sas(self, account: str, container: str, key: str) -> str:
        now = time.time()
        cached = self._sas.get(container)
        if cached is None or cached[1] - now < _SAS_LIFETIME / 4:
            start = datetime.datetime.fromtimestamp(now - 300, datetime.timezone.utc)
            expiry = datetime.datetime.fromtimestamp(now + _SAS_LIFETIME, datetime.timezone.utc)
            sas = self._container_sas(account, container, account_key=key, permission="r", start=start, expiry=expiry)
            cached = self._sas[container] = (sas, now + _SAS_LIFETIME)
        return cached[0]

    async def _token(self) -> str:
        now = time.time()
        if self._bearer is None or self._bearer[1] - now < 300:
            exc_mod, where = self._exc, "azure-identity token"

            async def attempt(n: int) -> Any:
                try:
                    return await self._token_credential.get_token("https://storage.azure.com/.default")
                except (exc_mod.ServiceRequestError, exc_mod.ServiceResponseError, aiohttp.ClientError,
                        ConnectionError) as exc:
                    raise Transient(f"{type(exc).__name__}: {exc}") from exc
                except Exception as exc:  # CredentialUnavailableError, ClientAuthenticationError & co
                    # DefaultAzureCredential has tried its chain (a managed identity's endpoint is
                    # retried by azure-identity itself, and the chain drops the HTTP status), so
                    # what reaches here is a refusal or no credential at all: not retried.
                    raise AccessDeniedError(
                        f"azure://: no usable Azure credentials ({type(exc).__name__}: {exc}); {_HINT}"
                    ) from exc

            token = await with_retries(where, attempt, self.options, self.events)
            self._bearer = (token.token, float(token.expires_on))
        return self._bearer[0]

    # -- uploads: the SDK ------------------------------------------------------------------------------
    async def put(self, local_path: str, url: str) -> None:
        container, name = split_azure_url(url)
        blob = self._svc().get_blob_client(container, name)
        length = (await asyncio.get_running_loop().run_in_executor(None, os.stat, local_path)).st_size
        exc_mod = self._exc

        async def attempt(n: int) -> None:
            try:
                with open(local_path, "rb") as fh:  # noqa: ASYNC230 - the SDK reads it block by block
                    await blob.upload_blob(fh, length=length, overwrite=True, max_concurrency=2)
            except exc_mod.HttpResponseError as exc:
                if not exc.status_code:
                    raise Transient(f"{type(exc).__name__}: {exc}") from exc
                headers = getattr(getattr(exc, "response", None), "headers", None) or {}
                raise status_error(url, int(exc.status_code), str(exc.reason or ""), headers, "upload", _HINT) from exc
            except (exc_mod.ServiceRequestError, exc_mod.ServiceResponseError, aiohttp.ClientError,
                    ConnectionError) as exc:
                raise Transient(f"{type(exc).__name__}: {exc}") from exc
            except exc_mod.AzureError as exc:
                raise UploadError(f"{url}: {type(exc).__name__}: {exc}") from exc

        await with_retries(url, attempt, self.options, self.events, verb="upload")

    async def aclose(self) -> None:
        if self._closed:
            return
        service, self._service = self._service, None
        credential, self._token_credential = self._token_credential, None
        with contextlib.suppress(Exception):
            if service is not None:
                await asyncio.shield(service.close())
            if credential is not None:
                await asyncio.shield(credential.close())
        await super().aclose()
