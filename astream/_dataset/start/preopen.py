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
(fetched on astream's loop thread by the one
:class:`~astream._dataset.read.ranged.RangedReader`, with the engine's transfer settings
and a hint's throttling policy, decoded on an executor thread). Which row groups may be
decoded is the dataset's :class:`~astream._dataset.read.policy.SourcePolicy`'s decision;
this module applies the budgets. Over a network the agent's transfer fetches those bytes
again: the budget bounds that (4 MB is 0.4 s of a 10 MB/s link), and a larger row group is
left to the agent. A shuffled first batch may read many row groups: the rest are the
agent's. It is a hint: a failure is logged at debug level and the reader decodes the
installed file.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from concurrent.futures import Future
from dataclasses import dataclass

import xxhash

from astream._dataset import tuning
from astream._dataset.layout import SampleMap
from astream._dataset.read.policy import SourcePolicy
from astream._dataset.read.ranged import RangedReader, read_row_group_here
from astream._dataset.read.shards import Decoded, OpenShards
from astream._dataset.runtime import portal
from astream._format.index import ShardInfo
from astream._format.parquet.reader import ParquetLayout, RowGroupReader
from astream._node.provider import parse_key

__all__ = ["preopen"]

log = logging.getLogger("astream.dataset")


@dataclass(frozen=True)
class _Job:
    """One row group to read ahead: where from, which stream, how it decodes."""

    decoded: Future[Decoded]
    url: str
    stream: int
    shard: int
    layout: ParquetLayout
    info: ShardInfo


def preopen(keys: list[str], smap: SampleMap, policy: SourcePolicy, shards: OpenShards) -> list[Future[Decoded]]:
    """Offer ``shards`` the row groups among ``keys`` (shard keys, in the order they are read)
    that apply (``policy``), the first ones up to ``preopen_bytes`` (local folders) and
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
        shard = firsts[stream] + index
        where = policy.decodable(shard)
        layout = smap.layouts[shard]
        info = smap.indexes[stream].shards[index]
        if where is None or info.source is None or not isinstance(layout, ParquetLayout):
            continue
        url, in_place = where
        if info.source.nbytes > budget[in_place]:
            # (a shuffled first batch may read many row groups: the rest are the agent's)
            budget[in_place] = 0
            continue
        budget[in_place] -= info.source.nbytes
        if not in_place and policy.installed(shard):
            continue  # (installed already: the reader opens it at once)
        job = _Job(Future(), url, stream, shard, layout, info)
        shards.offer(shard, job.decoded)
        (local if in_place else remote).append(job)
    if local:
        threading.Thread(target=_read_all, args=(local, policy), name="astream-preopen", daemon=True).start()
    if remote:
        portal().submit(_fetch_all(remote, policy))
    return [job.decoded for job in (*local, *remote)]


def _read_all(jobs: list[_Job], policy: SourcePolicy) -> None:
    for job in jobs:  # in the order they are read
        _run(job, policy)


def _run(job: _Job, policy: SourcePolicy) -> None:
    if not job.decoded.set_running_or_notify_cancel():
        return
    try:
        if policy.installed(job.shard):
            raise FileExistsError(f"{policy.cache_path(job.shard)} is installed already")  # (the reader opens it)
        assert job.info.source is not None
        job.decoded.set_result(_decode(job, read_row_group_here(job.url, job.info.source)))
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


async def _fetch_all(jobs: list[_Job], policy: SourcePolicy) -> None:
    """The row groups of other remotes, on astream's loop thread: fetched by range through the
    one ranged reader (a failure falls back to the agent's transfer), decoded on an executor
    thread, one after the other."""
    ranged = RangedReader(policy.transfers)
    loop = asyncio.get_running_loop()
    try:
        for job in jobs:
            if not job.decoded.set_running_or_notify_cancel():
                continue
            try:
                assert job.info.source is not None
                data = await ranged.row_group(job.stream, job.url, job.info.source)
                job.decoded.set_result(await loop.run_in_executor(None, _decode, job, data))
            except BaseException as exc:
                _failed(job, exc)
                if not isinstance(exc, Exception):
                    raise
    finally:
        for job in jobs:  # (cancelled before their turn: nobody waits for them)
            if not job.decoded.done():
                job.decoded.cancel()
        await ranged.aclose()


def _first_global_shards(smap: SampleMap) -> list[int]:
    """Per stream, the global index of its first shard."""
    out, total = [], 0
    for index in smap.indexes:
        out.append(total)
        total += len(index.shards)
    return out
