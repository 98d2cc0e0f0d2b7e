"""``RangedReader``: the one reader of remote bytes by range, ahead of the node's transfer.

Two early sources need a few bytes of a shard before the node agent has installed it: the
records of an uncompressed MDS shard (:mod:`astream._dataset.read.peek`) and a resume's
first Parquet row groups (:mod:`astream._dataset.start.preopen`). Both read them here, and
nowhere else, and talk to the remote as the node's engine does: each stream's transfer
settings come from the same derivation as the engine's
(:meth:`~astream._node.provider.EngineSpec.transfer_options`: its ``download_timeout``,
``download_retry`` and ``storage_options``), retried and timed out by the same storage
backends. One difference, the throttling policy of a hint: where the engine halves its
transfers for a remote that sheds load (429, 503, SlowDown), a read ahead gives up at once
(``yield_to_throttle``) and leaves those bytes to the engine's transfer, which fetches them
anyway. A failure is never the caller's error: the source turns itself off for the shard
and the installed file serves it.

Lives on one event loop (a :class:`~astream._storage.registry.StoragePool` per distinct
settings, made on first use) and is closed with its user.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import replace

from astream._cache.ranged import copy_ranges_from, fetch_ranges
from astream._format.index import SourceRanges
from astream._resource import AsyncResource
from astream._storage.base import Storage, StorageOptions
from astream._storage.local import local_path_of
from astream._storage.registry import StoragePool
from astream._storage.sink import BufferedSink

__all__ = ["RangedReader", "hint_options", "read_row_group_here"]


def hint_options(options: StorageOptions) -> StorageOptions:
    """The engine's transfer settings ``options`` as a read ahead uses them (see the module)."""
    return replace(options, retry=replace(options.retry, yield_to_throttle=True))


class RangedReader(AsyncResource):
    """Ranged reads of the remotes of a dataset's streams.

    Args:
        options: per stream, the engine's transfer settings of its remote
            (:meth:`~astream._node.provider.EngineSpec.transfer_options`).
    """

    def __init__(self, options: Sequence[StorageOptions]) -> None:
        self._options = [hint_options(o) for o in options]
        self._pools: dict[StorageOptions, StoragePool] = {}

    def storage(self, stream: int, url: str) -> Storage:
        """The backend of ``url``, a file of stream ``stream``'s remote."""
        options = self._options[stream]
        pool = self._pools.get(options)
        if pool is None:
            pool = self._pools[options] = StoragePool(options)
        return pool.get(url)

    async def read_range(self, stream: int, url: str, first: int, stop: int) -> bytes:
        """Bytes ``first:stop`` of ``url`` (one request, retried as the engine's are).

        Raises:
            AstreamError, OSError: as the backend's ``read_range``.
        """
        return await self.storage(stream, url).read_range(url, first, stop)

    async def row_group(self, stream: int, url: str, source: SourceRanges) -> bytes:
        """A Parquet row group's bytes (its column chunks, then its footer, checked first
        against the index's digest: :func:`~astream._cache.ranged.fetch_ranges`), as the
        node's transfer would install them."""
        sink = _Memory()
        await fetch_ranges(self.storage(stream, url), url, source, sink)
        return sink.getvalue()

    async def aclose(self) -> None:
        pools, self._pools = list(self._pools.values()), {}
        for pool in pools:
            await pool.aclose()


def read_row_group_here(url: str, source: SourceRanges) -> bytes:
    """:meth:`RangedReader.row_group` of a file of a local folder, on the calling thread (no
    loop, no backend: one ``pread`` per range, the footer checked first)."""
    collect = _Collect()
    fd = os.open(local_path_of(url), os.O_RDONLY)
    try:
        copy_ranges_from(fd, url, source, collect)
    finally:
        os.close(fd)
    return collect.getvalue()


class _Memory:
    """A :class:`~astream._storage.sink.Sink` that keeps the bytes."""

    def __init__(self) -> None:
        self._chunks: list[bytes] = []
        self.received = 0

    async def write(self, data: bytes) -> None:
        self._chunks.append(data)
        self.received += len(data)

    async def restart(self) -> None:
        self._chunks, self.received = [], 0

    def getvalue(self) -> bytes:
        return self._chunks[0] if len(self._chunks) == 1 else b"".join(self._chunks)


class _Collect(BufferedSink):
    """A sink that keeps the bytes (fed on the calling thread, not through an executor)."""

    def __init__(self) -> None:
        super().__init__()
        self._chunks: list[bytes] = []

    def _consume(self, chunks: list[bytes]) -> None:
        self._chunks.extend(chunks)

    def _reset(self) -> None:
        self._chunks = []

    def _close_files(self) -> None:
        pass

    def _remove_files(self) -> None:
        pass

    def getvalue(self) -> bytes:
        return self._chunks[0] if len(self._chunks) == 1 else b"".join(self._chunks)
