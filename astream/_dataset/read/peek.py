"""Records of a shard read straight from the remote, before the shard has arrived.

A reader that needs samples of a shard still on its way would wait for the whole file:
64 MB is ~45 ms on loopback and a second or more on a cloud link, the largest part of a
cold first batch (and of a resume that lands on a shard not yet cached). An uncompressed
MDS shard can be read in place instead: its header gives every record's byte range, so
the few records a batch needs arrive in one or two ranged reads while the download of
the whole file goes on. The records are put into a small shard of their own and read by
:class:`~astream._format.shard.ShardReader`, so every check of the format layer applies.

It serves the start of an iteration: once a batch comes from the cache, the reader stops
reading ahead (later it would fetch bytes the download fetches anyway, and on a link that
is the bottleneck that costs throughput). Where it does not apply (the reader waits for
the download, as before):

- shards other than MDS (text formats, Parquet row groups, tars): they carry no header of
  record offsets;
- shards stored compressed on the remote (``zip_data``): there is no byte range to read;
- streams with ``validate_hash``: the records would be handed out before the file that
  holds them could be checked;
- beyond a quarter of a shard's bytes (at least one batch): past that the download is
  better spent, and a slow link would otherwise carry the shard twice;
- remotes other than a local directory in a loader's worker processes: importing the
  HTTP client there costs more time and memory than the download it would save;
- after any failure for a shard (a server without ranges, a header that disagrees with
  index.json, a network error): the download's own checks then report what is wrong.
"""

from __future__ import annotations

import asyncio
import logging
import os
import struct
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import xxhash

from astream._arrays import sorted_unique
from astream._dataset import tuning
from astream._dataset.layout import PerShard, SampleMap
from astream._dataset.read.ledger import Span
from astream._format.index import ShardInfo
from astream._format.kinds import SampleSource
from astream._format.record import RecordLayout
from astream._format.shard import ShardReader
from astream._storage.base import Storage, StorageOptions
from astream._storage.config import RemoteConfig
from astream._storage.registry import StoragePool, configure, join_url, scheme_of
from astream._storage.retry import RetryPolicy
from astream.errors import AstreamError, ShardFormatError

__all__ = ["PeekedRecords", "RemotePeek", "check_head", "coalesce", "small_shard"]

log = logging.getLogger("astream.peek")

Int64Array = npt.NDArray[np.int64]

_U32 = np.dtype("<u4")


class PeekedRecords:
    """Some records of one shard, addressed by their index in the shard.

    ``spans`` are the shard's byte ranges they were decoded from, with digests: what the
    reader checks against the installed file once the shard arrives
    (:class:`~astream._dataset.read.ledger.ServedLedger`).
    """

    def __init__(self, reader: SampleSource, offsets: Int64Array, spans: list[Span]) -> None:
        self._reader = reader
        self._offsets = offsets  # sorted, unique: entry i of the small shard is record offsets[i]
        self.spans = spans
        # (st_dev, st_ino) of the cache's temporary the spans were read from; None: the remote.
        self.source: tuple[int, int] | None = None
        # Set when the entries are records ``run, run + 1, ...`` back to back (a run of an
        # arriving file): the reader may then decode many batches of it at once.
        self.run: int | None = None

    @property
    def reader(self) -> SampleSource:
        """The small shard the records are entries of (entry i is record ``offsets[i]``)."""
        return self._reader

    def run_covers(self, offsets: Int64Array) -> npt.NDArray[np.bool_]:
        """Per record of ``offsets``: whether it is an entry of this run (all False if no run)."""
        if self.run is None:
            return np.zeros(len(offsets), bool)
        return (offsets >= self.run) & (offsets < self.run + len(self._offsets))

    def get_batch(self, offsets: Int64Array) -> dict[str, Any]:
        return self._reader.get_batch(np.searchsorted(self._offsets, offsets))

    def get(self, offset: int) -> dict[str, Any]:
        return self._reader.get(int(np.searchsorted(self._offsets, offset)))


class RemotePeek:
    """Ranged reads of the records a reader needs from shards it is still waiting for.

    Lives on one event loop (the reader's) and is closed with the reader.

    Args:
        smap: where every global shard's records live and how they decode.
        sources: per global shard, ``(remote URL, cache path)`` of its uncompressed file,
            or None where reading ahead does not apply (see :meth:`sources_of`).
    """

    def __init__(
        self,
        smap: SampleMap,
        sources: Sequence[tuple[str, str] | None],
        configs: Sequence[RemoteConfig] | None = None,
    ) -> None:
        self._smap = smap
        self._sources = sources
        self._configs = list(configs) if configs is not None else None
        self._heads: dict[int, Int64Array] = {}
        self._spent: dict[int, int] = {}
        self._off: set[int] = set()
        self._pool: StoragePool | None = None

    @staticmethod
    def sources_of(
        smap: SampleMap, streams: Sequence[Any], *, network: bool
    ) -> Sequence[tuple[str, str] | None] | None:
        """Per global shard, ``(remote URL, cache path)`` of its uncompressed file where a
        peek applies (else None), or None when no shard of the dataset can be peeked.

        Args:
            streams: the dataset's resolved streams (``remote``, ``split``, ``validate_hash``,
                ``local_dir``).
            network: whether remotes other than a local directory may be read.
        """
        folders = [os.path.join(s.local_dir, s.split) if s.split else s.local_dir for s in streams]
        usable = [s.remote is not None and not s.validate_hash and (network or scheme_of(s.remote) in ("", "file"))
                  for s in streams]

        def source(s: int, info: ShardInfo) -> tuple[str, str]:
            name = info.raw_data.basename
            return join_url(streams[s].remote, streams[s].split, name), os.path.join(folders[s], name)

        # Only MDS shards carry their records' byte ranges in a header of their own (a
        # writer config says whether its shards are compressed: zip_data goes with it).
        out = PerShard(smap, usable, [info.zip_data is None and info.format == "mds" for info in smap.layout_entries],
                       source)
        return out if out.any() else None

    def can(self, shard: int) -> bool:
        """Whether ``shard``'s records may be read from the remote now: it applies, it has not
        failed, and the shard is not in the cache already (then its lease is a moment away)."""
        source = self._sources[shard]
        return source is not None and shard not in self._off and not os.path.exists(source[1])

    async def race(
        self, shards: Int64Array, offsets: Int64Array, downloads: dict[int, asyncio.Future[str]]
    ) -> dict[int, PeekedRecords] | None:
        """Read the records of a batch (``shards``/``offsets`` per position) whose shards in
        ``downloads`` are still arriving, unless those downloads finish first.

        Returns:
            The records of every shard in ``downloads``, or None: a shard cannot be read
            ahead, a read failed, or the downloads were first (then read from the cache).
        """
        if not all(self.can(shard) for shard in downloads):
            return None
        reads = {shard: asyncio.ensure_future(self.records(shard, offsets[shards == shard])) for shard in downloads}
        ready = list(downloads.values())
        gathered = asyncio.gather(*reads.values())
        # Its outcome is read below or not at all (cancelled: a CancelledError nobody wants).
        gathered.add_done_callback(_retrieve)
        try:
            # Whichever comes first: the records, or every shard they are in.
            waiting: set[asyncio.Future[Any]] = {gathered, *ready}
            while gathered in waiting and any(f in waiting for f in ready):
                _, waiting = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
            if gathered.done():
                peeked = {shard: r for shard, r in zip(reads, gathered.result(), strict=True) if r is not None}
                if len(peeked) == len(reads):
                    return peeked
        finally:
            gathered.cancel()  # the reads still running: the download was first
        return None

    async def records(self, shard: int, offsets: Int64Array) -> PeekedRecords | None:
        """Records ``offsets`` of global shard ``shard``, or None (then wait for the download)."""
        source = self._sources[shard]
        if source is None or shard in self._off:
            return None
        url = source[0]
        try:
            return await self._read(shard, url, offsets)
        except asyncio.CancelledError:
            raise
        except (AstreamError, OSError) as exc:
            self._off.add(shard)
            log.debug("astream: reading %s ahead of its download failed (%s); waiting for the download", url, exc)
            return None

    async def _read(self, shard: int, url: str, offsets: Int64Array) -> PeekedRecords | None:
        info = self._smap.indexes[self._smap.shard_stream[shard]].shards[self._smap.shard_local[shard]]
        wanted = sorted_unique(offsets)
        head = self._heads.get(shard)
        prefix = b""
        header: list[Span] = []
        if head is None:
            head, prefix = await self._head(shard, url, info.samples, info.raw_data.bytes, int(wanted[-1]))
            length = 4 + 4 * (info.samples + 1)
            header.append((0, length, xxhash.xxh3_64_intdigest(prefix[:length])))
        begin, end = head[wanted], head[wanted + 1]
        spent = self._spent.get(shard, 0)
        if spent and spent + int((end - begin).sum()) > info.raw_data.bytes * tuning.READ_AHEAD.ranged_budget:
            self._off.add(shard)  # the download is the cheaper way now
            return None
        # Ranges of records no more than ``coalesce_bytes`` apart, one request each; none for those
        # that came with the offset table.
        lo, hi = coalesce(begin, end)
        storage = self._storage(url, shard)
        fetched = [len(prefix)]

        async def read(a: int, b: int) -> bytes:
            first, stop = int(begin[a]), int(end[b - 1])
            if stop <= len(prefix):
                return prefix[first:stop]
            data = await storage.read_range(url, first, stop)
            fetched.append(len(data))
            return data

        chunks = await asyncio.gather(*(read(int(a), int(b)) for a, b in zip(lo, hi, strict=True)))
        self._spent[shard] = self._spent.get(shard, 0) + sum(fetched)
        return small_shard(self._smap, shard, f"{url} (records read ahead of the download)", wanted, begin, end,
                           lo, hi, chunks, header)

    async def _head(self, shard: int, url: str, samples: int, size: int, last: int) -> tuple[Int64Array, bytes]:
        """The shard's offset table, checked against index.json, and the bytes read with it.

        When the records wanted (up to record ``last``) are likely to lie close behind the
        table (the start of a shard, as an unshuffled epoch reads it), they come in the same
        request: one round trip instead of two, which on a cloud link is most of the wait.
        """
        length = 4 + 4 * (samples + 1)
        if length > size:
            raise ShardFormatError(f"{url}: index.json's {samples} samples cannot fit its {size} bytes")
        # The records up to ``last`` at the shard's mean record size, with room for the
        # columns' JSON MosaicML writes after the table and for uneven records.
        guess = length + tuning.READ_AHEAD.speculate_slack + int((last + 1) * (size - length) / max(samples, 1) * 1.25)
        stop = guess if guess - length <= min(tuning.READ_AHEAD.speculate_bytes, size * tuning.READ_AHEAD.ranged_budget) else length
        raw = await self._storage(url, shard).read_range(url, 0, stop)
        (n,) = struct.unpack_from("<I", raw, 0)
        head = np.frombuffer(raw, _U32, samples + 1, 4).astype(np.int64)
        check_head(head, n, samples, size, url)
        self._heads[shard] = head
        return head, raw

    def _storage(self, url: str, shard: int) -> Storage:
        if self._pool is None:
            # One quick attempt: a failure falls back to the download, which retries.
            self._pool = StoragePool(StorageOptions(retry=RetryPolicy(retries=0)))
        config = self._configs[self._smap.shard_stream[shard]] if self._configs is not None else None
        if config:
            return self._pool.get(url, configure(url, config, self._pool.options).remote)
        return self._pool.get(url)

    async def aclose(self) -> None:
        pool, self._pool = self._pool, None
        if pool is not None:
            await pool.aclose()


def coalesce(begin: Int64Array, end: Int64Array) -> tuple[Int64Array, Int64Array]:
    """Groups ``lo[k]:hi[k]`` of sorted records (byte ranges ``begin:end``) no more than
    ``coalesce_bytes`` apart: each group is read with one request (or one ``pread``)."""
    split = np.flatnonzero(begin[1:] - end[:-1] > tuning.READ_AHEAD.coalesce_bytes) + 1
    return np.r_[0, split].astype(np.int64), np.r_[split, len(begin)].astype(np.int64)


def small_shard(
    smap: SampleMap, shard: int, name: str, wanted: Int64Array, begin: Int64Array, end: Int64Array,
    lo: Int64Array, hi: Int64Array, chunks: Sequence[bytes], spans: list[Span],
) -> PeekedRecords:
    """Records ``wanted`` of global shard ``shard`` (bytes ``begin:end`` each, read in groups
    ``lo:hi`` as ``chunks``) as a small shard of their own, checked by the format layer.
    ``spans`` (the offset table's, if it was read for them) gain each chunk's."""
    n = len(wanted)
    sizes = end - begin
    table = np.empty(n + 1, np.int64)
    table[0] = 4 + 4 * (n + 1)
    np.cumsum(sizes, out=table[1:])
    table[1:] += table[0]
    body = bytearray(int(table[-1]))
    struct.pack_into("<I", body, 0, n)
    body[4 : table[0]] = table.astype(_U32).tobytes()
    for (a, b), chunk in zip(zip(lo, hi, strict=True), chunks, strict=True):
        base = int(begin[a])
        for i in range(int(a), int(b)):
            body[table[i] : table[i + 1]] = chunk[int(begin[i]) - base : int(end[i]) - base]
        spans.append((base, int(end[b - 1]), xxhash.xxh3_64_intdigest(chunk)))
    layout = smap.layouts[shard]
    assert isinstance(layout, RecordLayout)  # sources_of offers MDS shards only
    reader = ShardReader(body, layout, name=name, shard=shard, expected_samples=n)
    return PeekedRecords(reader, wanted, spans)


def check_head(head: Int64Array, n: int, samples: int, size: int, name: str) -> None:
    """The offset table of a shard (``n`` as its header says) against index.json."""
    length = 4 + 4 * (samples + 1)
    # (MosaicML puts the columns' JSON between the offset table and the first record.)
    if n != samples or head[0] < length or head[-1] != size or (np.diff(head) < 0).any():
        raise ShardFormatError(f"{name}: its header disagrees with index.json")


def _retrieve(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()
