"""Shuffled batches of small records decoded ahead, many batches at once.

A shuffled batch of 32 small records takes a few records from each of six or seven
shards. Reading it shard by shard pays each shard's fixed cost (index checks, one
decode call per column, the scatter back into batch order) for a handful of records:
~20 µs per shard and batch, which held a shuffled epoch at a third to a half of the
unshuffled one. Here the reader decodes the positions of many batches at once, as one
batch (:func:`~astream._format.gather.gather_batch`, each shard's records in file
order), and hands out each batch as slices of the result: a shard's fixed cost is
paid once per window of batches, not once per batch. The same holds for batches of one
shard whose records have variable-size columns (a decode call per column and batch), so
those are decoded ahead unshuffled too; a batch of fixed-size records from one shard is
one take already and is read as it is.

What may be decoded ahead is the reader's call (:class:`~astream._dataset.read.reader.EpochReader`):
only positions whose shards are held by leases that are ready now, never with a bounded
cache (a bounded reader pins only its current batch), only for records of
``small_record`` bytes or less on average (for larger ones a shard's fixed cost is
already small against the copy), and only while the window's records fit
``ahead_bytes`` (tuning.py).

Only columns that decode cheaply are decoded ahead (numbers, arrays, ``bytes``, ``str``
and the ``str_*`` numbers; not images, JSON or pickles, whose decoding dwarfs a shard's
fixed cost and would hold the event loop's thread for a whole window).

Exactness: a window is read only from MDS shards that store the same columns, so
whether a column comes back as an array (a batchable fixed-size encoding) or as a list
(every other) is the layout's, the same for any subset of the window's records; a
batch's slice of it equals what reading the batch alone gives (value, dtype, shape,
element types). Arrays are copied out of the window, so a batch kept by the caller
does not hold the window's memory.
"""

from __future__ import annotations

import itertools
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from astream._dataset import tuning
from astream._format.encodings.ndarray import NDArrayEncoding
from astream._format.encodings.scalars import (
    BytesEncoding,
    StrDecimalEncoding,
    StrEncoding,
    StrFloatEncoding,
    StrIntEncoding,
)
from astream._format.gather import common_fixed_layout, gather_batch, take_rows
from astream._format.kinds import SampleSource, ShardLayout
from astream._format.record import RecordLayout
from astream._format.shard import decode_rows

__all__ = ["DecodedAhead", "decode_ahead", "same_mds_columns"]

Int64Array = npt.NDArray[np.int64]



class DecodedAhead:
    """Positions ``start:stop`` of a reader's sequence, read ahead.

    Records of variable-size columns are kept decoded, in sequence order (``columns``);
    fixed-size records are kept as raw rows grouped by shard (``rows``, with ``at``: the
    row of each position), and a batch is one take of its rows, decoded as a batch of
    one shard is: the window's copy stays in the CPU's caches, the batch's in its own.
    """

    def __init__(
        self, start: int, stop: int, columns: dict[str, Any] | None = None,
        rows: tuple[RecordLayout, npt.NDArray[np.uint8], npt.NDArray[np.intp], Int64Array, str] | None = None,
        scratch: npt.NDArray[np.uint8] | None = None,
    ) -> None:
        self.start = start
        self.stop = stop
        self._columns = columns or {}
        self._rows = rows
        self.scratch = scratch  # the flat buffer ``rows`` lie in: the next window's, once this one is done

    def covers(self, a: int, b: int) -> bool:
        return self.start <= a and b <= self.stop

    def batch(self, a: int, b: int) -> dict[str, Any]:
        """Positions ``a:b`` (inside the window) as a batch of their own."""
        i, j = a - self.start, b - self.start
        if self._rows is not None:
            layout, rows, at, offsets, where = self._rows
            return decode_rows(layout, rows.take(at[i:j], axis=0), where, offsets[i:j])
        return {name: column[i:j].copy() if isinstance(column, np.ndarray) else column[i:j]
                for name, column in self._columns.items()}


# Encodings whose values decode in about a microsecond (a copy, a parse of a short text,
# a view), besides the fixed-size numeric ones (decoded as one block). Images, lists of
# them, JSON and pickles take tens of microseconds or more a value: for them a shard's
# fixed cost is small, and a window would hold the loop's thread for as long as a few
# thousand of them take.
_CHEAP = (BytesEncoding, StrEncoding, StrIntEncoding, StrFloatEncoding, StrDecimalEncoding, NDArrayEncoding)


def same_mds_columns(layouts: list[ShardLayout]) -> bool:
    """True if every layout is an MDS record layout storing the same columns, each of an
    encoding that decodes cheaply (see ``_CHEAP``)."""
    first = layouts[0] if layouts else None
    if not isinstance(first, RecordLayout):
        return False
    if not all(enc.batchable or isinstance(enc, _CHEAP) for enc in first.encodings):
        return False
    return all(layout is first or first.same_columns(layout) for layout in layouts[1:])


def decode_ahead(
    layouts: Sequence[ShardLayout], open_source: Callable[[int], SampleSource], shards: Int64Array,
    offsets: Int64Array, start: int, done: DecodedAhead | None = None,
) -> DecodedAhead | None:
    """Decode the records ``offsets`` of ``shards`` (positions ``start...``) as one batch.

    ``layouts`` are every shard's (by global shard index), ``open_source`` opens one.
    ``done`` is the window before, no longer read: its buffer of rows is reused (a fresh
    4 MB array costs a page fault per 4 KB page when it is first written: 1,000 faults,
    as many as reading 64 MB of shards sequentially).
    Returns None, decoding nothing, unless the shards store the same MDS columns.

    Raises:
        AstreamError: a shard does not open or a record does not decode (the caller reads
            batch by batch instead, so the error comes with the batch it belongs to).
    """
    n = len(shards)
    if not n:
        return DecodedAhead(start, start, {})
    # Grouped by shard and, inside a shard, by offset: each shard's take walks its map
    # forwards (fewer page faults and TLB misses than the shuffled order).
    span = int(offsets.max()) + 1
    order = np.argsort(shards * span + offsets)
    grouped = shards[order]
    cuts = np.flatnonzero(grouped[1:] != grouped[:-1]) + 1
    edges = [0, *cuts.tolist(), n]
    uniq = grouped[edges[:-1]].tolist()
    if not same_mds_columns([layouts[shard] for shard in uniq]):
        return None
    positions = [order[a:b] for a, b in itertools.pairwise(edges)]
    parts = [offsets[at] for at in positions]
    sources = [open_source(shard) for shard in uniq]
    where = f"shards {uniq}"
    layout = common_fixed_layout(sources)
    if layout is not None:
        at = np.empty(n, np.intp)
        at[order] = np.arange(n)
        scratch = None if done is None else done.scratch
        if scratch is None or scratch.size < n * layout.fixed_size:
            # Sized for the largest window at once (pages are only touched as rows land in
            # them): windows grow from ``first_batches``, and each larger buffer would fault anew.
            scratch = np.empty(max(n * layout.fixed_size, tuning.READ_AHEAD.ahead_bytes), np.uint8)
        rows = take_rows(sources, parts, layout, scratch)
        return DecodedAhead(start, start + n, rows=(layout, rows, at, offsets, where), scratch=scratch)
    if len(sources) == 1:  # (an unshuffled window: its records in order, nothing to put back)
        return DecodedAhead(start, start + n, columns=sources[0].get_batch(offsets))
    return DecodedAhead(start, start + n, columns=gather_batch(sources, positions, parts, n, where))
