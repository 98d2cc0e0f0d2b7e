"""Records of a shard served before its install, as a small shard of their own.

An early source (the shard's arriving file, ranged reads of the remote) reads some records
of a shard by their byte ranges (its offset table gives them) and puts them into a small
shard of their own (:func:`small_shard`), read by the format layer's
:class:`~astream._format.shard.ShardReader`, so every check of the format layer applies;
the spans they came from, with their digests, go with them (:class:`PeekedRecords`), for
the reader's :class:`~astream._dataset.read.ledger.ServedLedger`.
"""

from __future__ import annotations

import struct
from collections.abc import Sequence
from typing import Any

import numpy as np
import numpy.typing as npt
import xxhash

from astream._dataset import tuning
from astream._dataset.layout import SampleMap
from astream._dataset.read.ledger import Span
from astream._format.kinds import SampleSource
from astream._format.record import RecordLayout
from astream._format.shard import ShardReader
from astream.errors import ShardFormatError

__all__ = ["PeekedRecords", "check_head", "coalesce", "small_shard"]

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
    assert isinstance(layout, RecordLayout)  # (the source policy offers MDS shards only)
    reader = ShardReader(body, layout, name=name, shard=shard, expected_samples=n)
    return PeekedRecords(reader, wanted, spans)


def check_head(head: Int64Array, n: int, samples: int, size: int, name: str) -> None:
    """The offset table of a shard (``n`` as its header says) against index.json."""
    length = 4 + 4 * (samples + 1)
    # (MosaicML puts the columns' JSON between the offset table and the first record.)
    if n != samples or head[0] < length or head[-1] != size or (np.diff(head) < 0).any():
        raise ShardFormatError(f"{name}: its header disagrees with index.json")
