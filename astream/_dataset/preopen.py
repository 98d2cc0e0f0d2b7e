"""A resume's first row groups, read and decoded while the node agent starts.

``Loader(); load_state_dict(); next()`` on a fresh machine waits for three things in a
row: the node agent to start (its thread, loop, engine and cache scan), the row group
the state points into to be installed, and that row group to be decoded (a few
milliseconds of pyarrow for a 32k-row group). The first two cannot be skipped: the
agent owns the cache. The third need not wait for them. At ``load_state_dict``,
:func:`preopen` reads the row group's ranges from the source file (its footer checked
first, as the agent's copy checks it) and decodes them, on a thread of its own and on
one core, while the agent starts and installs the same row group on the other; the
decoding is offered to this process's open shards (:meth:`OpenShards.offer`).

How it stays exact: the reader takes an offered row group only where it would open the
installed file, that is once the agent installed the shard, and only if that file holds
exactly the bytes it was decoded from (their xxh3 digests agree); otherwise the offer is
dropped and the installed file decoded, as without it. Nothing here writes to the cache.

Where it applies: Parquet row groups of a stream whose remote is a local folder (reading
the same bytes twice costs a page-cache copy there; over a network it would take link
bandwidth from the agent's own transfer), not in the cache yet, the first ones read up to
:data:`PREOPEN_BYTES` in all (a shuffled first batch may read many). It is a hint: a
failure is logged at debug level and the reader decodes the installed file.
"""

from __future__ import annotations

import logging
import os
import threading
from concurrent.futures import Future

import xxhash

from astream._cache.ranged import copy_ranges_from
from astream._dataset.layout import SampleMap
from astream._dataset.provider import parse_key
from astream._dataset.shards import Decoded, OpenShards
from astream._dataset.stream import Stream
from astream._format.index import ShardInfo
from astream._format.parquet.reader import ParquetLayout, RowGroupReader
from astream._storage.local import local_path_of
from astream._storage.registry import join_url, scheme_of
from astream._storage.sink import BufferedSink

__all__ = ["PREOPEN_BYTES", "preopen"]

log = logging.getLogger("astream.dataset")

# Bytes of row groups decoded ahead of their install at most, in all (their cached bytes).
PREOPEN_BYTES = 64 << 20


def preopen(keys: list[str], smap: SampleMap, streams: tuple[Stream, ...], shards: OpenShards) -> list[Future[Decoded]]:
    """Offer ``shards`` the row groups among ``keys`` (shard keys, in the order they are read)
    that apply, up to :data:`PREOPEN_BYTES` in all, read and decoded one after the other on
    a thread started here; returns the decodings offered at once. Offers of an earlier call
    are withdrawn (a state loaded again points elsewhere)."""
    shards.withdraw_offers()
    firsts = _first_global_shards(smap)
    jobs: list[tuple[Future[Decoded], str, str, ParquetLayout, ShardInfo]] = []
    budget = PREOPEN_BYTES
    for key in keys:
        stream, local = parse_key(key)
        s = streams[stream]
        shard = firsts[stream] + local
        layout = smap.layouts[shard]
        info = smap.indexes[stream].shards[local]
        source = info.source
        if (not isinstance(layout, ParquetLayout) or source is None or s.remote is None
                or scheme_of(s.remote) not in ("", "file")):
            continue
        if source.nbytes > budget:
            break  # (a shuffled first batch may read many row groups: the rest is the agent's)
        budget -= source.nbytes
        folder = os.path.join(s.local_dir, s.split) if s.split else s.local_dir
        cached = os.path.join(folder, *info.raw_data.basename.split("/"))
        url = join_url(join_url(s.remote, s.split), source.file)
        decoded: Future[Decoded] = Future()
        shards.offer(shard, decoded)
        jobs.append((decoded, url, cached, layout, info))
    if jobs:
        threading.Thread(target=_decode_all, args=(jobs,), name="astream-preopen", daemon=True).start()
    return [job[0] for job in jobs]


def _decode_all(jobs: list[tuple[Future[Decoded], str, str, ParquetLayout, ShardInfo]]) -> None:
    for job in jobs:  # in the order they are read
        _decode(*job)


def _decode(decoded: Future[Decoded], url: str, cached: str, layout: ParquetLayout, info: ShardInfo) -> None:
    if not decoded.set_running_or_notify_cancel():
        return
    try:
        if os.path.exists(cached):
            raise FileExistsError(f"{cached} is installed already")  # (the reader opens it at once)
        assert info.source is not None
        collect = _Collect()
        fd = os.open(local_path_of(url), os.O_RDONLY)
        try:
            copy_ranges_from(fd, url, info.source, collect)
        finally:
            os.close(fd)
        data = collect.getvalue()
        # One core: the node agent's start, which this overlaps, needs the other.
        reader = RowGroupReader(f"{url} (row group read ahead of its install)", layout, info, data, threads=False)
        decoded.set_result((reader, xxhash.xxh3_64_intdigest(data)))
    except BaseException as exc:
        log.debug("astream: row group %s of %s not decoded ahead: %s", info.index, url, exc)
        decoded.set_exception(exc)


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
