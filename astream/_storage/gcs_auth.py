"""The OAuth access token of ``gs://`` remotes, fetched under astream's retry policy.

gcloud-aio-auth knows every kind of Google credential (a service-account file, the
``gcloud`` user's refresh token, the metadata server of a GCE/GKE/TPU machine) and makes
the request that turns one into an access token (:meth:`Token.refresh`). Its own
``get()`` wraps that request in a tenacity loop of 5 attempts with random waits up to
60 s, blind to astream's ``download_retry``, ``download_timeout`` and throttling counts:
a token endpoint answering 503 or 429 would stall every download for minutes, or fail it
with a bare aiohttp error. So astream calls ``refresh()`` once per attempt itself, inside
:func:`with_retries` (the schedule every download follows), caches the token until
shortly before it expires, and lets one refresh serve every download that waits for it.

gcloud-aio-auth reads ``GCE_METADATA_HOST`` (or the older ``GCE_METADATA_ROOT``) once,
when it is imported; astream reads it again when a token is made, so a variable set
after the import (a test, a notebook) is honoured too.
"""

from __future__ import annotations

import asyncio
import math
import os
import time
from typing import Any

import aiohttp

from astream._storage.base import StorageOptions, TransferEvents, Transient, with_retries
from astream._storage.http import _NETWORK_ERRORS, status_error
from astream.errors import AccessDeniedError, DownloadError

__all__ = ["GoogleToken", "metadata_token_uri"]

SCOPE = "https://www.googleapis.com/auth/devstorage.read_write"
_METADATA_PATH = "/computeMetadata/v1/instance/service-accounts/default/token?recursive=true"
# Refresh once this fraction of a token's lifetime has passed (an hour's token: after 54 min).
_REFRESH_AFTER = 0.9


def metadata_token_uri() -> str | None:
    """The metadata server's token URL named by ``GCE_METADATA_HOST``/``GCE_METADATA_ROOT``, if set."""
    host = os.environ.get("GCE_METADATA_HOST") or os.environ.get("GCE_METADATA_ROOT")
    if not host:
        return None
    host = host.rstrip("/")
    return f"{host if host.startswith(('http://', 'https://')) else 'http://' + host}{_METADATA_PATH}"


class GoogleToken:
    """A refreshed-on-demand access token of the credentials gcloud-aio-auth finds.

    Args:
        service_file: a service-account (or authorized-user) JSON file; None: the
            application-default credentials (``GOOGLE_APPLICATION_CREDENTIALS``, the gcloud
            user file, else the metadata server).
        session: astream's aiohttp session (the token requests share its pool).
        options: the retry policy and timeouts of the storage.
        events: told about retries (throttling is counted like a download's).
        hint: what to set when the credentials are refused.
    """

    def __init__(
        self, service_file: str | None, session: aiohttp.ClientSession, options: StorageOptions,
        events: TransferEvents, hint: str,
    ) -> None:
        from gcloud.aio.auth import Token
        from gcloud.aio.auth.token import Type

        self._token: Any = Token(service_file=service_file, session=session, scopes=[SCOPE])  # type: ignore[arg-type]
        self._metadata = self._token.token_type == Type.GCE_METADATA
        if self._metadata:
            self._token.token_uri = metadata_token_uri() or self._token.token_uri
        self._options, self._events, self._hint = options, events, hint
        self._value: tuple[str, float] | None = None  # (token, refresh after: time.monotonic())
        self._lock = asyncio.Lock()

    @property
    def uri(self) -> str:
        """Where the token comes from (the OAuth endpoint or the metadata server)."""
        return str(self._token.token_uri)

    async def get(self) -> str:
        """The access token, refreshed first when it is missing or nearly expired.

        Raises:
            AccessDeniedError: the endpoint refused the credentials, answered something that
                is not a token, or (no credentials found anywhere) the metadata server did
                not answer.
            DownloadError: the endpoint kept failing (5xx, 429, resets) after every retry.
        """
        if self._value is not None and time.monotonic() < self._value[1]:
            return self._value[0]
        async with self._lock:  # one refresh for every download that waits on it
            if self._value is not None and time.monotonic() < self._value[1]:
                return self._value[0]
            started = time.monotonic()
            try:
                answer = await with_retries(self.uri, self._attempt, self._options, self._events)
            except DownloadError as exc:
                if not self._metadata:
                    raise
                raise AccessDeniedError(
                    f"gs://: no Google credentials found, and the metadata server at {self.uri} did not give "
                    f"a token ({exc}); {self._hint}"
                ) from exc
            self._value = (answer.value, started + max(1.0, answer.expires_in * _REFRESH_AFTER))
            return self._value[0]

    async def _attempt(self, n: int) -> Any:
        try:
            return await self._token.refresh(timeout=max(1, math.ceil(self._options.timeouts.download)))
        except aiohttp.ClientResponseError as exc:
            error = status_error(self.uri, exc.status, exc.message, exc.headers or {}, "download", self._hint)
            if isinstance(error, Transient):
                raise error from exc  # 5xx, 408, 429: retried and counted, as a download is
            raise AccessDeniedError(
                f"gs://: the token endpoint {self.uri} refused the credentials with HTTP {exc.status} "
                f"{exc.message}; {self._hint}"
            ) from exc
        except (*_NETWORK_ERRORS, asyncio.IncompleteReadError) as exc:
            raise Transient(f"{type(exc).__name__}: {exc or 'connection lost'}") from exc
        except (ValueError, KeyError, TypeError) as exc:  # not JSON, no access_token, a bad key file
            raise AccessDeniedError(
                f"gs://: no usable token from {self.uri} ({type(exc).__name__}: {exc}); {self._hint}"
            ) from exc
