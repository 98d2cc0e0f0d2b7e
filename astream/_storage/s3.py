"""``s3://bucket/key`` remotes with aiobotocore (the optional extra ``s3``).

The endpoint and credentials come from the variables MosaicML Streaming users already
set: ``S3_ENDPOINT_URL`` plus the standard ``AWS_*`` ones (and ``~/.aws``).
botocore's own retries are turned off; astream's :class:`RetryPolicy` decides, so the
time bound is the same for every scheme. ``SlowDown``/503/429 count as throttling. A
cut transfer resumes with a ``Range`` request guarded by ``IfMatch: <ETag>``.

``AWS_PROFILE`` picks a profile of ``~/.aws``. A public bucket needs no credentials:
when none are found the requests go unsigned (``storage_options={"anonymous": True}``
forces that). Requester-pays buckets: ``requester_pays=True``, or the bucket named in
``MOSAICML_STREAMING_AWS_REQUESTER_PAYS`` (comma-separated names, as MosaicML reads it).
``storage_options`` also take ``endpoint_url``, ``region``, ``key``/``secret``/``token``,
``profile`` and ``ca_bundle``.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import re
from typing import Any
from urllib.parse import urlsplit

from astream._format.names import checked_listing
from astream._storage.answers import (
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
from astream._storage.s3_errors import translate
from astream._storage.sink import Sink
from astream.errors import (
    DownloadError,
    MissingExtraError,
    RangeNotSupportedError,
    RemoteNotFoundError,
    UsageError,
)

__all__ = ["S3Storage", "split_s3_url"]

_CONTENT_RANGE = re.compile(r"^\s*bytes\s+(\d+)-(\d+)/(\d+)\s*$")


def split_s3_url(url: str) -> tuple[str, str]:
    """``s3://bucket/a/b`` -> ``("bucket", "a/b")``."""
    parts = urlsplit(url)
    if parts.scheme != "s3" or not parts.netloc:
        raise UsageError(f"{url!r} is not an s3://bucket/key URL")
    return parts.netloc, parts.path.lstrip("/")


def _import_aiobotocore() -> tuple[Any, Any, Any]:
    try:
        import botocore.exceptions
        from aiobotocore.config import AioConfig
        from aiobotocore.session import get_session
    except ImportError as exc:
        raise MissingExtraError("s3:// remotes", "s3", "aiobotocore") from exc
    return get_session, AioConfig, botocore.exceptions


class S3Storage(Storage):
    """A remote in an S3 (or S3-compatible) bucket."""

    schemes = ("s3",)
    option_keys = frozenset(
        {"endpoint_url", "region", "key", "secret", "token", "profile", "anonymous", "requester_pays", "ca_bundle"}
    )
    credentials_hint = (
        "set AWS_ACCESS_KEY_ID/AWS_SECRET_ACCESS_KEY or AWS_PROFILE (a public bucket: "
        "storage_options={'anonymous': True}; a requester-pays one: MOSAICML_STREAMING_AWS_REQUESTER_PAYS)"
    )

    def __init__(
        self,
        options: StorageOptions | None = None,
        events: TransferEvents | None = None,
        *,
        client: Any = None,
    ) -> None:
        super().__init__(options, events)
        self._get_session, self._AioConfig, self._exc = _import_aiobotocore()
        import botocore

        self._UNSIGNED = botocore.UNSIGNED
        self._client = client
        self._owns_client = client is None
        self._client_cm: Any = None
        self._lock: asyncio.Lock | None = None
        self._etags: dict[str, str] = {}
        config = self.options.remote
        pays = os.environ.get("MOSAICML_STREAMING_AWS_REQUESTER_PAYS", "")
        self._requester_pays = config.flag("requester_pays", "s3://")
        self._pays_buckets = {b.strip() for b in pays.split(",") if b.strip()}

    def split(self, url: str) -> tuple[str, str]:
        """``(bucket, key)`` of ``url`` (subclasses for other schemes override it)."""
        return split_s3_url(url)

    def _extra(self, bucket: str) -> dict[str, Any]:
        """Arguments every request for ``bucket`` carries (``RequestPayer``)."""
        if self._requester_pays or bucket in self._pays_buckets:
            return {"RequestPayer": "requester"}
        return {}

    async def _client_args(self) -> tuple[Any, dict[str, Any], bool]:
        """The botocore session, ``create_client`` arguments, and whether to sign requests."""
        config = self.options.remote
        session = self._get_session()
        profile = config.text("profile", "s3://")
        if profile:
            session.set_config_variable("profile", profile)
        key, secret = config.text("key", "s3://"), config.text("secret", "s3://")
        args: dict[str, Any] = {
            "endpoint_url": config.text("endpoint_url", "s3://") or os.environ.get("S3_ENDPOINT_URL") or None,
            "region_name": config.text("region", "s3://")
            or os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1",
        }
        if key and secret:
            args.update(aws_access_key_id=key, aws_secret_access_key=secret,
                        aws_session_token=config.text("token", "s3://"))
        if config.text("ca_bundle", "s3://"):
            args["verify"] = config.text("ca_bundle", "s3://")
        unsigned = config.flag("anonymous", "s3://")
        if not unsigned and not (key and secret):
            try:
                unsigned = await session.get_credentials() is None  # a public bucket: no credentials at all
            except self._exc.BotoCoreError:
                unsigned = False
        return session, args, unsigned

    async def _get_client(self) -> Any:
        if self._closed:
            raise UsageError("this S3Storage is closed")
        if self._client is not None:
            return self._client
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            if self._client is None:
                opts = self.options
                session, args, unsigned = await self._client_args()
                signing = {"signature_version": self._UNSIGNED} if unsigned else {}
                config = self._AioConfig(
                    connect_timeout=opts.timeouts.connect,
                    read_timeout=opts.timeouts.download,
                    retries={"total_max_attempts": 1},
                    max_pool_connections=opts.max_connections,
                    **signing,
                )
                self._client_cm = session.create_client("s3", config=config, **args)
                self._client = await self._client_cm.__aenter__()
                self._needs_close = True
        return self._client

    def _translate(self, url: str, exc: BaseException, verb: str = "download") -> Exception:
        """Map a botocore/aiohttp failure to Transient (retry) or a final astream error."""
        return translate(url, exc, self._exc, self.credentials_hint, self._etags, verb)

    async def fetch_into(
        self, url: str, sink: Sink, *, size: int | None = None, events: TransferEvents | None = None
    ) -> None:
        ev = events or self.events
        client = await self._get_client()
        bucket, key = self.split(url)
        chunk = self.options.chunk_size

        async def attempt(n: int) -> None:
            kwargs: dict[str, Any] = {"Bucket": bucket, "Key": key, **self._extra(bucket)}
            offset = sink.received
            etag = self._etags.get(url)
            if offset and etag:
                kwargs.update(Range=f"bytes={offset}-", IfMatch=etag)
            elif offset:
                await sink.restart()
                offset = 0
            try:
                resp = await client.get_object(**kwargs)
                body = resp["Body"]
                try:
                    total = self._total(url, resp, offset, size)
                    if resp.get("ETag"):
                        self._etags[url] = resp["ETag"]
                    async for data in body.iter_chunks(chunk):
                        ev.on_bytes(len(data))
                        await sink.write(data)
                finally:
                    body.close()
            except (Transient, DownloadError):
                raise
            except Exception as exc:
                raise self._translate(url, exc) from exc
            if sink.received != total:
                raise Transient(f"the body ended after {sink.received} of {total} bytes")

        try:
            await with_retries(url, attempt, self.options, ev)
        finally:
            self._etags.pop(url, None)

    def _total(self, url: str, resp: dict[str, Any], offset: int, size: int | None) -> int:
        if offset:
            match = _CONTENT_RANGE.match(resp.get("ContentRange") or "")
            if not match or int(match.group(1)) != offset:
                self._etags.pop(url, None)
                raise Transient(f"unusable ContentRange {resp.get('ContentRange')!r}; restarting")
            total = int(match.group(3))
        else:
            total = int(resp.get("ContentLength", -1))
        check_remote_size(url, total, size)
        return total

    async def read_bytes(self, url: str) -> bytes:
        client = await self._get_client()
        bucket, key = self.split(url)

        async def attempt(n: int) -> bytes:
            try:
                resp = await client.get_object(Bucket=bucket, Key=key, **self._extra(bucket))
                async with resp["Body"] as body:
                    return bytes(await body.read())
            except Exception as exc:
                raise self._translate(url, exc) from exc

        return await with_retries(url, attempt, self.options, self.events)

    async def read_range(self, url: str, start: int, end: int) -> bytes:
        start, end = check_range(url, start, end)
        if start == end:
            return b""
        client = await self._get_client()
        bucket, key = self.split(url)
        length = end - start

        async def attempt(n: int) -> bytes:
            try:
                resp = await client.get_object(
                    Bucket=bucket, Key=key, Range=f"bytes={start}-{end - 1}", **self._extra(bucket)
                )
                # Leaving this block closes the body: an unread one drops its connection.
                async with resp["Body"] as body:
                    status = int(resp.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
                    if status == 200 or (status != 206 and not resp.get("ContentRange")):
                        # S3 itself always honours a single range; an S3-compatible store may not.
                        raise RangeNotSupportedError(
                            f"{url}: the endpoint answered a Range request with the whole object; "
                            "it does not serve byte ranges"
                        )
                    check_content_range(url, resp.get("ContentRange"), start, end)
                    if int(resp.get("ContentLength", length)) != length:
                        raise DownloadError(
                            f"{url}: asked for {length} bytes at {start} but the answer is "
                            f"{resp.get('ContentLength')} bytes long; not retried"
                        )
                    data = bytes(await body.read())
            except (Transient, DownloadError):
                raise
            except Exception as exc:
                past_end = self._past_end(url, exc, start, end)
                if past_end is not None:
                    raise past_end from exc
                raise self._translate(url, exc) from exc
            return check_body_length(url, data, start, length)

        return await with_retries(url, attempt, self.options, self.events)

    def _past_end(self, url: str, exc: BaseException, start: int, end: int) -> DownloadError | None:
        """The error for S3's answer to a range that starts at or past the end (416 InvalidRange).

        ``_translate`` reads that answer as an object that changed under a resume (retried);
        here it means an object shorter than asked, which no retry fixes.
        """
        if not isinstance(exc, self._exc.ClientError):
            return None
        error = exc.response.get("Error", {})
        status = int(exc.response.get("ResponseMetadata", {}).get("HTTPStatusCode", 0) or 0)
        if str(error.get("Code", "")) != "InvalidRange" and status != 416:
            return None
        actual = str(error.get("ActualObjectSize", ""))  # S3 and moto say how long the object is
        return range_past_end(url, int(actual) if actual.isdigit() else None, start, end)

    async def exists(self, url: str) -> bool:
        client = await self._get_client()
        bucket, key = self.split(url)

        async def attempt(n: int) -> bool:
            try:
                await client.head_object(Bucket=bucket, Key=key, **self._extra(bucket))
            except Exception as exc:
                err = self._translate(url, exc)
                if isinstance(err, RemoteNotFoundError):
                    return False
                raise err from exc
            return True

        return await with_retries(url, attempt, self.options, self.events)

    async def stat(self, url: str) -> ObjectInfo:
        client = await self._get_client()
        bucket, key = self.split(url)

        async def attempt(n: int) -> ObjectInfo:
            try:
                head = await client.head_object(Bucket=bucket, Key=key, **self._extra(bucket))
            except Exception as exc:
                raise self._translate(url, exc) from exc
            return ObjectInfo(int(head["ContentLength"]), head.get("ETag"))

        return await with_retries(url, attempt, self.options, self.events)

    async def list_objects(self, url: str) -> list[tuple[str, ObjectInfo]]:
        client = await self._get_client()
        bucket, key = self.split(url)
        prefix = key.rstrip("/") + "/" if key.strip("/") else ""

        async def attempt(n: int) -> list[tuple[str, ObjectInfo]]:
            out: list[tuple[str, ObjectInfo]] = []
            token: str | None = None
            try:
                while True:
                    extra = {"ContinuationToken": token} if token else {}
                    page = await client.list_objects_v2(Bucket=bucket, Prefix=prefix, **extra, **self._extra(bucket))
                    # A key ending in "/" is a folder marker (consoles make them), not data.
                    out.extend((obj["Key"][len(prefix):], ObjectInfo(int(obj["Size"]), obj.get("ETag")))
                               for obj in page.get("Contents", ()) if not obj["Key"].endswith("/"))
                    token = page.get("NextContinuationToken")
                    if not page.get("IsTruncated") or not token:
                        return out
            except Exception as exc:
                raise self._translate(url, exc) from exc

        return checked_listing(url, await with_retries(url, attempt, self.options, self.events))

    async def put(self, local_path: str, url: str) -> None:
        client = await self._get_client()
        bucket, key = self.split(url)

        def read() -> bytes:
            with open(local_path, "rb") as fh:
                return fh.read()

        data = await asyncio.get_running_loop().run_in_executor(None, read)

        async def attempt(n: int) -> None:
            try:
                await client.put_object(Bucket=bucket, Key=key, Body=data, **self._extra(bucket))
            except Exception as exc:
                raise self._translate(url, exc, "upload") from exc

        await with_retries(url, attempt, self.options, self.events, verb="upload")

    async def aclose(self) -> None:
        if self._closed:
            return
        self._closed = True
        cm, self._client_cm = self._client_cm, None
        self._client = None
        if cm is not None and self._owns_client:
            with contextlib.suppress(Exception):
                await asyncio.shield(cm.__aexit__(None, None, None))
