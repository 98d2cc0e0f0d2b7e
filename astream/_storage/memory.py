"""``memory://<bucket>/<key>``: a remote kept in process memory.

The smallest complete :class:`~astream._storage.base.Storage` backend (every operation
of the protocol, retries and size checks included), used by tests and shown in
``docs/storage.md`` as the worked example of a backend. ``astream.testing`` registers
it under the ``memory`` scheme and re-exports it.
"""

from __future__ import annotations

import asyncio
import collections
import hashlib

from astream._storage.answers import (
    check_range,
    check_remote_size,
    range_past_end,
)
from astream._storage.base import (
    ObjectInfo,
    Storage,
    StorageOptions,
    TransferEvents,
    with_retries,
)
from astream._storage.sink import Sink
from astream.errors import RemoteNotFoundError, UsageError

__all__ = ["MemoryStorage", "memory_bucket", "memory_factory"]

_BUCKETS: dict[str, dict[str, bytes]] = collections.defaultdict(dict)


def memory_bucket(name: str) -> dict[str, bytes]:
    """The dict behind ``memory://<name>/...`` (keys are paths inside the bucket)."""
    return _BUCKETS[name]


class MemoryStorage(Storage):
    """A remote kept in process memory, at ``memory://<bucket>/<key>`` (for tests)."""

    schemes = ("memory",)

    @staticmethod
    def _locate(url: str) -> tuple[dict[str, bytes], str]:
        if not url.startswith("memory://"):
            raise UsageError(f"{url!r} is not a memory:// URL")
        bucket, _, key = url[len("memory://") :].partition("/")
        return _BUCKETS[bucket], key

    async def fetch_into(
        self, url: str, sink: Sink, *, size: int | None = None, events: TransferEvents | None = None
    ) -> None:
        ev = events or self.events
        bucket, key = self._locate(url)

        async def attempt(n: int) -> None:
            if key not in bucket:
                raise RemoteNotFoundError(f"{url}: no such object")
            data = bucket[key]
            check_remote_size(url, len(data), size)
            step = self.options.chunk_size
            for i in range(sink.received, len(data), step):
                ev.on_bytes(len(data[i : i + step]))
                await sink.write(data[i : i + step])

        await with_retries(url, attempt, self.options, ev)

    async def read_bytes(self, url: str) -> bytes:
        bucket, key = self._locate(url)
        if key not in bucket:
            raise RemoteNotFoundError(f"{url}: no such object")
        return bucket[key]

    async def read_range(self, url: str, start: int, end: int) -> bytes:
        start, end = check_range(url, start, end)
        if start == end:
            return b""
        bucket, key = self._locate(url)
        if key not in bucket:
            raise RemoteNotFoundError(f"{url}: no such object")
        data = bucket[key]
        if len(data) < end:
            raise range_past_end(url, len(data), start, end)
        return data[start:end]

    async def exists(self, url: str) -> bool:
        bucket, key = self._locate(url)
        return key in bucket

    async def stat(self, url: str) -> ObjectInfo:
        bucket, key = self._locate(url)
        if key not in bucket:
            raise RemoteNotFoundError(f"{url}: no such object")
        return ObjectInfo(len(bucket[key]), hashlib.md5(bucket[key]).hexdigest())

    async def put(self, local_path: str, url: str) -> None:
        bucket, key = self._locate(url)
        data = await asyncio.get_running_loop().run_in_executor(None, _read_file, local_path)
        bucket[key] = data


def _read_file(path: str) -> bytes:
    with open(path, "rb") as fh:
        return fh.read()


def memory_factory(options: StorageOptions, events: TransferEvents | None) -> Storage:
    """The ``memory`` scheme's factory (for :func:`astream.register_storage`)."""
    return MemoryStorage(options, events)
