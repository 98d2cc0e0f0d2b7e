"""``gs://bucket/object`` remotes: Google Cloud Storage (the optional extra ``gcs``).

Reads are HTTP GETs of the JSON API's media URL (``.../o/<object>?alt=media``) through
:class:`HttpStorage`, so a download streams ranged reads into the sink under astream's
own retry, timeout, Range-resume and throttling policy (GCS answers 429/503 when it
sheds load) with astream's aiohttp session. ``gcloud-aio-storage`` (aiohttp-based, on
the same session) does the uploads; gcloud-aio-auth's credentials make the OAuth token,
fetched under the same retry policy (``gcs_auth.py``), never the library's own.

Credentials, first found wins:

1. ``storage_options``: ``anonymous=True`` (a public bucket), ``service_file`` (a
   service-account JSON), ``token`` (an OAuth access token), or ``hmac_key`` and
   ``hmac_secret`` (HMAC keys, through the S3-compatible endpoint).
2. ``STORAGE_EMULATOR_HOST`` (an emulator: no credentials).
3. ``GOOGLE_APPLICATION_CREDENTIALS``.
4. ``GCS_KEY`` and ``GCS_SECRET`` (HMAC keys, as MosaicML Streaming users set them).
5. Application-default credentials (``gcloud auth application-default login``, or the
   metadata server of a GCE/GKE/TPU machine; ``GCE_METADATA_HOST`` names another one).
"""

from __future__ import annotations

import asyncio
import os
from dataclasses import replace
from typing import Any
from urllib.parse import quote, urlsplit

import aiohttp

from astream._storage.base import ObjectInfo, Storage, StorageOptions, TransferEvents, Transient, with_retries
from astream._storage.config import RemoteConfig
from astream._storage.gcs_auth import GoogleToken
from astream._storage.http import _NETWORK_ERRORS, HttpStorage, status_error
from astream._storage.s3 import S3Storage
from astream.errors import AccessDeniedError, MissingExtraError, UsageError

__all__ = ["GcsHmacStorage", "GcsStorage", "gcs_storage", "split_gs_url"]

OPTION_KEYS = frozenset({"endpoint_url", "anonymous", "service_file", "token", "hmac_key", "hmac_secret", "project"})
_PUBLIC_API = "https://storage.googleapis.com"
_S3_ENDPOINT = "https://storage.googleapis.com"
_UNUSED_TOKEN = object()
_HINT = (
    "set GOOGLE_APPLICATION_CREDENTIALS to a service-account file, or GCS_KEY and GCS_SECRET to HMAC keys, "
    "or run `gcloud auth application-default login`; a public bucket: storage_options={'anonymous': True}"
)


def split_gs_url(url: str) -> tuple[str, str]:
    """``gs://bucket/a/b`` -> ``("bucket", "a/b")``."""
    parts = urlsplit(url)
    if parts.scheme not in ("gs", "gcs") or not parts.netloc:
        raise UsageError(f"{url!r} is not a gs://bucket/object URL")
    return parts.netloc, parts.path.lstrip("/")


def _import_gcloud() -> Any:
    try:
        from gcloud.aio import storage
    except ImportError as exc:
        raise MissingExtraError("gs:// remotes", "gcs", "gcloud-aio-storage") from exc
    return storage


def gcs_storage(options: StorageOptions, events: TransferEvents | None = None) -> Storage:
    """The backend of ``gs://``: JSON API with OAuth, or the S3-compatible API with HMAC keys."""
    config = options.remote
    config.check("gs://", OPTION_KEYS)
    explicit = config.text("hmac_key", "gs://") or config.text("hmac_secret", "gs://")
    oauth = (
        config.flag("anonymous", "gs://")
        or config.get("service_file")
        or config.get("token")
        or os.environ.get("STORAGE_EMULATOR_HOST")
        or os.environ.get("GOOGLE_APPLICATION_CREDENTIALS")
    )
    if explicit or (not oauth and os.environ.get("GCS_KEY") and os.environ.get("GCS_SECRET")):
        return GcsHmacStorage(options, events)
    return GcsStorage(options, events)


class GcsStorage(HttpStorage):
    """A remote in a Google Cloud Storage bucket, read through the JSON API."""

    schemes = ("gs",)
    option_keys = OPTION_KEYS
    credentials_hint = _HINT

    def __init__(self, options: StorageOptions | None = None, events: TransferEvents | None = None) -> None:
        super().__init__(options, events)
        self._gcloud = _import_gcloud()
        config = self.options.remote
        emulator = os.environ.get("STORAGE_EMULATOR_HOST") or None
        explicit = config.text("endpoint_url", "gs://")
        endpoint = explicit or emulator or _PUBLIC_API
        if not endpoint.startswith(("http://", "https://")):
            endpoint = f"http://{endpoint}"  # STORAGE_EMULATOR_HOST may be a bare host:port
        self._api = endpoint.rstrip("/")
        # An emulator takes no credentials; an explicit endpoint (a proxy, a private one) may.
        self._anonymous = config.flag("anonymous", "gs://") or (explicit is None and emulator is not None)
        self._static_token = config.text("token", "gs://")
        self._service_file = config.text("service_file", "gs://")
        self._client: Any = None
        self._token: GoogleToken | None = None

    def _gcs(self) -> Any:
        """gcloud-aio-storage's client, on astream's session (made on first use).

        It never fetches a token itself (``api_is_dev``: no Authorization of its own): every
        upload carries the header of :meth:`_auth`, whose token is fetched under astream's
        retry policy rather than the client's tenacity loop.
        """
        if self._client is None:
            # A token object it never asks (api_is_dev), so it does not read credential files itself.
            self._client = self._gcloud.Storage(
                session=self._get_session(), api_root=self._api, api_is_dev=True, token=_UNUSED_TOKEN
            )
        return self._client

    async def _auth(self) -> dict[str, str]:
        if self._anonymous:
            return {}
        if self._static_token is not None:
            return {"Authorization": f"Bearer {self._static_token}"}
        if self._token is None:
            try:
                self._token = GoogleToken(self._service_file, self._get_session(), self.options, self.events, _HINT)
            except (OSError, ValueError, KeyError) as exc:  # an unreadable or malformed credentials file
                raise AccessDeniedError(
                    f"gs://: the Google credentials file cannot be used ({type(exc).__name__}: {exc}); {_HINT}"
                ) from exc
        return {"Authorization": f"Bearer {await self._token.get()}"}

    def _object_url(self, url: str) -> str:
        bucket, name = split_gs_url(url)
        return f"{self._api}/storage/v1/b/{quote(bucket, safe='')}/o/{quote(name, safe='')}"

    async def _request(self, url: str) -> tuple[str, dict[str, str]]:
        return f"{self._object_url(url)}?alt=media", await self._auth()

    async def _head(self, url: str) -> ObjectInfo | None:
        # The object's metadata (there is no HEAD of a media URL on every server).
        session = self._get_session()
        target, headers = self._object_url(url), await self._auth()

        async def attempt(n: int) -> ObjectInfo | None:
            try:
                async with session.get(target, headers=headers) as resp:
                    if resp.status == 404:
                        return None
                    if resp.status < 300:
                        meta = await resp.json(content_type=None)
                        return ObjectInfo(int(meta["size"]), meta.get("etag") or meta.get("generation"))
                    raise self._error(url, resp)
            except _NETWORK_ERRORS as exc:
                raise Transient(f"{type(exc).__name__}: {exc or 'connection lost'}") from exc

        return await with_retries(url, attempt, self.options, self.events)

    async def put(self, local_path: str, url: str) -> None:
        bucket, name = split_gs_url(url)
        client = self._gcs()
        headers = await self._auth()

        async def attempt(n: int) -> None:
            try:
                with open(local_path, "rb") as fh:  # noqa: ASYNC230 - the client reads it in chunks
                    await client.upload(
                        bucket, name, fh, headers=dict(headers), content_type="application/octet-stream",
                        timeout=int(self.options.timeouts.download) + 1,
                    )
            except aiohttp.ClientResponseError as exc:
                raise status_error(url, exc.status, exc.message, exc.headers or {}, "upload", _HINT) from exc
            except (*_NETWORK_ERRORS, asyncio.IncompleteReadError) as exc:
                raise Transient(f"{type(exc).__name__}: {exc or 'connection lost'}") from exc

        await with_retries(url, attempt, self.options, self.events, verb="upload")


class GcsHmacStorage(S3Storage):
    """A ``gs://`` remote read with HMAC keys through GCS's S3-compatible XML API."""

    schemes = ("gs",)
    option_keys = OPTION_KEYS
    credentials_hint = "set GCS_KEY and GCS_SECRET (or storage_options hmac_key and hmac_secret) to valid HMAC keys"

    def __init__(self, options: StorageOptions | None = None, events: TransferEvents | None = None) -> None:
        options = options or StorageOptions()
        config = options.remote
        s3 = {
            "endpoint_url": config.text("endpoint_url", "gs://") or _S3_ENDPOINT,
            "key": config.text("hmac_key", "gs://") or os.environ.get("GCS_KEY"),
            "secret": config.text("hmac_secret", "gs://") or os.environ.get("GCS_SECRET"),
            "region": "auto",
        }
        super().__init__(replace(options, remote=RemoteConfig.of(s3)), events)

    def split(self, url: str) -> tuple[str, str]:
        return split_gs_url(url)
