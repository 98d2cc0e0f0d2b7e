"""S3's failures in astream's terms: retry (:class:`Transient`), or which final error.

Apart from :mod:`astream._storage.s3` because this mapping is one job with its own
vocabulary (botocore's error codes and statuses, which mean throttling, a changed
object, a missing key, refused credentials); the backend only runs the requests. Used by
every S3-compatible backend (:class:`~astream._storage.gcs.GcsHmacStorage` too).
"""

from __future__ import annotations

import asyncio
from typing import Any

import aiohttp

from astream._storage.retry import Transient
from astream.errors import AccessDeniedError, DownloadError, RemoteNotFoundError, UploadError

__all__ = ["translate"]

_THROTTLE_CODES = {"SlowDown", "Throttling", "ThrottlingException", "RequestLimitExceeded", "TooManyRequests"}
_NOT_FOUND_CODES = {"NoSuchKey", "NoSuchBucket", "404", "NotFound"}


def translate(url: str, exc: BaseException, exc_mod: Any, hint: str, etags: dict[str, str],
              verb: str = "download") -> Exception:
    """Map a botocore/aiohttp failure of ``url`` to Transient (retry) or a final astream error.

    Args:
        exc_mod: ``botocore.exceptions`` (imported by the backend: the extra is optional).
        hint: what to do about credentials (the backend's ``credentials_hint``).
        etags: the backend's ETags of resumed transfers; a changed object's is dropped.
        verb: ``"download"`` or ``"upload"`` (an upload's refusal is an ``UploadError``).
    """
    if isinstance(exc, exc_mod.ClientError):
        error = exc.response.get("Error", {})
        code = str(error.get("Code", ""))
        status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
        what = f"S3 {code or status}: {error.get('Message', '')}".rstrip(": ")
        if code in _THROTTLE_CODES or status in (429, 503):
            return Transient(f"{what} (bucket is throttling)", throttled=True)
        if status >= 500 or code in ("InternalError", "ServiceUnavailable"):
            return Transient(what)
        if code in ("PreconditionFailed", "InvalidRange") or status in (412, 416):
            etags.pop(url, None)  # (the resume that failed must not use it again)
            return Transient(f"{what}: the object changed while we resumed; restarting")
        denied = status in (401, 403) or code in ("AccessDenied", "InvalidAccessKeyId", "SignatureDoesNotMatch")
        if verb == "upload":
            why = f"; {hint}" if denied else ""
            return UploadError(f"{url}: upload refused ({what}){why}; not retried")
        if code in _NOT_FOUND_CODES or status == 404:
            return RemoteNotFoundError(f"{url}: {what}; check the bucket, the prefix and the split")
        if denied:
            return AccessDeniedError(f"{url}: {what}; {hint}; not retried")
        return DownloadError(f"{url}: {what}; not retried")
    if isinstance(exc, exc_mod.NoCredentialsError):
        return AccessDeniedError(f"{url}: no credentials found; {hint}")
    if isinstance(exc, (exc_mod.BotoCoreError, aiohttp.ClientError, ConnectionError, asyncio.IncompleteReadError)):
        return Transient(f"{type(exc).__name__}: {exc}")
    return DownloadError(f"{url}: {type(exc).__name__}: {exc}")
