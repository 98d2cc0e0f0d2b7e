"""A resume's first row groups, read and decoded before the node agent is asked for them.

``Loader(); load_state_dict(); next()`` on a fresh machine waited for three things in a
row: the node agent to start (its thread, loop, engine and cache scan), the row group the
state points into to be installed, and that row group to be decoded (a few milliseconds
of pyarrow for a 32k-row group). The agent owns the cache, so the install is its job; the
first batch need not wait for it. At ``load_state_dict``, :func:`preopen` reads the row
group's ranges from the source (its footer checked first, as the agent's transfer checks
it) and decodes them in the background; the decoding is offered to this process's open
shards (:meth:`OpenShards.offer`). The resume's first batch is taken from it in the
iterating thread (:mod:`astream._dataset.start.early`), while the node's start waits for it
(:meth:`~astream._dataset.start.warmup.WarmStart.hold`), and the reader takes the following
batches of the same row group from it too.

How it stays exact: what is served from a decoding is checked against the installed
file once the agent installed it (their xxh3 digests must agree; a difference stops the
iteration with :class:`~astream.errors.ServedSamplesError`). A reader that opens the
installed file takes an offered decoding only if that file holds exactly its bytes;
otherwise the offer is dropped and the installed file decoded. Nothing here writes to the
cache.

Where it applies: Parquet row groups not in the cache yet, the first ones read, up to
``preopen_bytes`` in all from a local folder (on a thread of its own: reading the same
bytes twice costs a page-cache copy) and ``preopen_network_bytes`` from other remotes
(fetched on astream's loop thread with one attempt, decoded on an executor thread). Over a
network the agent's transfer fetches those bytes again: the budget bounds that (4 MB is
0.4 s of a 10 MB/s link), and a larger row group is left to the agent. A shuffled first
batch may read many row groups: the rest are the agent's. It is a hint: a failure is
logged at debug level and the reader decodes the installed file.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
from concurrent.futures import Future
from dataclasses import dataclass

import xxhash

from astream._cache.ranged import copy_ranges_from, fetch_ranges
from astream._dataset import tuning
from astream._dataset.layout import SampleMap
from astream._dataset.read.shards import Decoded, OpenShards
from astream._dataset.runtime import portal
from astream._dataset.stream import Stream
from astream._format.index import ShardInfo
from astream._format.parquet.reader import ParquetLayout, RowGroupReader
from astream._node.provider import parse_key
from astream._storage.base import StorageOptions
from astream._storage.config import RemoteConfig
from astream._storage.local import local_path_of
from astream._storage.registry import StoragePool, configure, join_url, scheme_of
from astream._storage.retry import RetryPolicy
from astream._storage.sink import BufferedSink

__all__ = ["preopen"]

log = logging.getLogger("astream.dataset")



@dataclass(frozen=True)
class _Job:
    """One row group to read ahead: where from, where the agent will install it, how it decodes."""

    decoded: Future[Decoded]
    url: str
    cached: str
    layout: ParquetLayout
    info: ShardInfo
    remote: RemoteConfig | None  # None: a local folder


def preopen(keys: list[str], smap: SampleMap, streams: tuple[Stream, ...], shards: OpenShards) -> list[Future[Decoded]]:
    """Offer ``shards`` the row groups among ``keys`` (shard keys, in the order they are read)
    that apply, the first ones up to ``preopen_bytes`` (local folders) and
    ``preopen_network_bytes`` (other remotes), read and decoded
    one after the other in the background; returns the decodings offered, at once. Offers
    of an earlier call are withdrawn (a state loaded again points elsewhere)."""
    shards.withdraw_offers()
    firsts = _first_global_shards(smap)
    local: list[_Job] = []
    remote: list[_Job] = []
    budget = {True: tuning.READ_AHEAD.preopen_bytes, False: tuning.READ_AHEAD.preopen_network_bytes}
    for key in keys:
        stream, index = parse_key(key)
        s = streams[stream]
        shard = firsts[stream] + index
        layout = smap.layouts[shard]
        info = smap.indexes[stream].shards[index]
        source = info.source
        if not isinstance(layout, ParquetLayout) or source is None or s.remote is None:
            continue
        in_place = scheme_of(s.remote) in ("", "file")
        if source.nbytes > budget[in_place]:
            # (a shuffled first batch may read many row groups: the rest are the agent's)
            budget[in_place] = 0
            continue
        budget[in_place] -= source.nbytes
        folder = os.path.join(s.local_dir, s.split) if s.split else s.local_dir
        cached = os.path.join(folder, *info.raw_data.basename.split("/"))
        if not in_place and os.path.exists(cached):
            continue  # (installed already: the reader opens it at once)
        job = _Job(Future(), join_url(join_url(s.remote, s.split), source.file), cached, layout, info,
                   None if in_place else s.remote_config)
        shards.offer(shard, job.decoded)
        (local if in_place else remote).append(job)
    if local:
        threading.Thread(target=_read_all, args=(local,), name="astream-preopen", daemon=True).start()
    if remote:
        portal().submit(_fetch_all(remote))
    return [job.decoded for job in (*local, *remote)]


def _read_all(jobs: list[_Job]) -> None:
    for job in jobs:  # in the order they are read
        _run(job)


def _read_local(job: _Job) -> Decoded:
    assert job.info.source is not None
    collect = _Collect()
    fd = os.open(local_path_of(job.url), os.O_RDONLY)
    try:
        copy_ranges_from(fd, job.url, job.info.source, collect)
    finally:
        os.close(fd)
    return _decode(job, collect.getvalue())


def _run(job: _Job) -> None:
    if not job.decoded.set_running_or_notify_cancel():
        return
    try:
        if os.path.exists(job.cached):
            raise FileExistsError(f"{job.cached} is installed already")  # (the reader opens it at once)
        job.decoded.set_result(_read_local(job))
    except BaseException as exc:
        _failed(job, exc)


def _failed(job: _Job, exc: BaseException) -> None:
    log.debug("astream: row group %s of %s not decoded ahead: %s", job.info.index, job.url, exc)
    job.decoded.set_exception(exc)


def _decode(job: _Job, data: bytes) -> Decoded:
    # One core: the node agent's start, which this may overlap, needs the other.
    reader = RowGroupReader(f"{job.url} (row group read ahead of its install)", job.layout, job.info, data,
                            threads=False)
    return reader, xxhash.xxh3_64_intdigest(data)


async def _fetch_all(jobs: list[_Job]) -> None:
    """The row groups of other remotes, on astream's loop thread: fetched by range (one quick
    attempt: a failure falls back to the agent's transfer, which retries), decoded on an
    executor thread, one after the other."""
    pool = StoragePool(StorageOptions(retry=RetryPolicy(retries=0)))
    loop = asyncio.get_running_loop()
    try:
        for job in jobs:
            if not job.decoded.set_running_or_notify_cancel():
                continue
            try:
                assert job.info.source is not None
                assert job.remote is not None
                storage = pool.get(job.url, configure(job.url, job.remote, pool.options).remote)
                sink = _Memory()
                await fetch_ranges(storage, job.url, job.info.source, sink)
                job.decoded.set_result(await loop.run_in_executor(None, _decode, job, sink.getvalue()))
            except BaseException as exc:
                _failed(job, exc)
                if not isinstance(exc, Exception):
                    raise
    finally:
        for job in jobs:  # (cancelled before their turn: nobody waits for them)
            if not job.decoded.done():
                job.decoded.cancel()
        await pool.aclose()


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


def _first_global_shards(smap: SampleMap) -> list[int]:
    """Per stream, the global index of its first shard."""
    out, total = [], 0
    for index in smap.indexes:
        out.append(total)
        total += len(index.shards)
    return out
