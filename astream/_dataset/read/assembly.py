"""How positions of a reader's sequence become a batch (the assembly of the read path).

One shard's positions are one ``get_batch``; several shards' are one gather
(:func:`~astream._format.gather.gather_batch`) over their groups, worked out for many
batches at once (:class:`~astream._dataset.read.grouping.BatchGroups`); small records are
decoded many batches at a time (:func:`~astream._dataset.read.ahead.decode_ahead`), from
ready leases or a run of an arriving shard, and each batch is a slice of that window.
Every source of records (an installed shard, or records served early,
:class:`~astream._dataset.read.records.PeekedRecords`) is read through one interface, so a
batch equals what reading it alone from the installed files gives.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np
import numpy.typing as npt

from astream._arrays import group_positions
from astream._dataset import tuning
from astream._dataset.layout import SampleMap
from astream._dataset.read.ahead import DecodedAhead, decode_ahead
from astream._dataset.read.grouping import BatchGroups
from astream._dataset.read.records import PeekedRecords
from astream._dataset.read.shards import OpenShards, ResidentPages
from astream._dataset.read.sources import InstalledFile
from astream._format.gather import gather_batch
from astream._format.kinds import SampleSource
from astream._format.record import RecordLayout
from astream.errors import AstreamError

__all__ = ["Assembly", "read_positions"]

Int64Array = npt.NDArray[np.int64]


class Assembly:
    """One reader's batches made from the records of its positions.

    Args:
        smap: where every global sample id lives.
        shards: the process's open shard readers.
        bounds: the batch bounds of the reader's order.
        shard, offset: the shard and record of each position of the sequence.
        pages: the touched pages of the reader's shard maps.
        paths: per shard, the installed file of its ready lease (kept by the reader).
        bounded: a bounded cache (its pins cover one batch: nothing is decoded ahead).
        readable_until: the first position before a given one that a lease not ready yet may hold.
    """

    def __init__(self, smap: SampleMap, shards: OpenShards, bounds: Int64Array, shard: Int64Array,
                 offset: Int64Array, pages: ResidentPages, paths: dict[int, str], bounded: bool,
                 readable_until: Callable[[int], int]) -> None:
        self._smap = smap
        self._installed = InstalledFile(shards, paths)  # (the main path: the installed files)
        self._bounds = bounds
        self._shard, self._offset = shard, offset
        self._pages = pages
        self._bounded = bounded
        self._readable_until = readable_until
        self._groups: BatchGroups | None = None  # made at the first batch spanning shards
        # Batches decoded ahead (see astream._dataset.read.ahead): the current window, the
        # batches the next one may take, and the position before which none is tried.
        self._ahead: DecodedAhead | None = None
        self._ahead_batches = tuning.READ_AHEAD.first_batches
        self._ahead_off_until = 0

    def covers(self, a: int, b: int) -> bool:
        """Whether positions ``a:b`` are decoded already (a window read ahead)."""
        return self._ahead is not None and self._ahead.covers(a, b)

    def reader(self, shard: int, peeked: dict[int, PeekedRecords] | None = None) -> SampleSource | PeekedRecords:
        if peeked and shard in peeked:
            return peeked[shard]
        return self._installed.reader(shard)

    def read_batch(self, a: int, b: int, peeked: dict[int, PeekedRecords] | None = None,
                    k: int | None = None) -> dict[str, Any]:
        done = self._ahead
        if done is not None:
            if not peeked and done.covers(a, b):
                return done.batch(a, b)
            self._ahead = None  # passed: its memory goes now, or to the next window
        shards = self._shard[a:b]
        offsets = self._offset[a:b]
        bounds = self._bounds
        if k is None:
            k = int(np.searchsorted(bounds, a, side="right")) - 1
        whole = 0 <= k < len(bounds) - 1 and bounds[k] == a and bounds[k + 1] == b  # one of the plan's batches
        if shards[0] == shards[-1] and (shards == shards[0]).all():
            shard = int(shards[0])
            # Variable-size columns cost a decode call per column and batch: a window pays it
            # once for many batches, also from one shard. Fixed-size rows of one shard are
            # one take already.
            layout = self._smap.layouts[shard]
            if (whole and isinstance(layout, RecordLayout) and layout.num_var
                    and (ahead := self._decode_ahead(k, done, peeked)) is not None):
                return ahead.batch(a, b)
            return self.reader(shard, peeked).get_batch(offsets)
        if whole:
            if (ahead := self._decode_ahead(k, done, peeked)) is not None:
                return ahead.batch(a, b)
            if self._groups is None:
                self._groups = BatchGroups(self._shard, self._offset, bounds)
            uniq, groups, parts = self._groups.groups(k)  # grouped for many batches at once
        else:
            return read_positions(shards, offsets, functools.partial(self.reader, peeked=peeked))
        sources = [self.reader(g, peeked) for g in uniq]
        return gather_batch(sources, groups, parts, b - a, f"shards {uniq}")

    def _decode_ahead(self, k: int, done: DecodedAhead | None,
                      peeked: dict[int, PeekedRecords] | None = None) -> DecodedAhead | None:
        """Batch ``k`` and the next ones decoded as one window, if that may be done now
        (``done``: the window before, whose memory it may reuse; ``peeked``: the records
        batch ``k`` was served early, by shard).

        Only positions held by ready leases (never with a bounded cache: its pins cover one
        batch) or by the runs of arriving shards batch ``k`` was served from, records of
        ``small_record`` bytes or less on average, within ``ahead_bytes``, and at least two
        batches; else None (batch by batch).
        """
        bounds = self._bounds
        a = int(bounds[k])
        if self._bounded or a < self._ahead_off_until:
            return None
        runs = {shard: got for shard, got in (peeked or {}).items() if got.run is not None}
        if peeked and len(runs) < len(peeked):
            return None  # (records from the remote, or a few of an arriving file: this batch alone)
        want = int(bounds[min(k + self._ahead_batches, len(bounds) - 1)])
        stop = self._readable_until(want)
        if runs:
            stop = self._in_runs_until(a, stop, want, runs)
        cost = np.cumsum(self._smap.mean_record_bytes[self._shard[a:stop]])
        if not len(cost) or cost[-1] > tuning.READ_AHEAD.small_record * len(cost):
            self._ahead_off_until = stop  # large records: a shard's fixed cost is small beside them
            return None
        stop = a + int(np.searchsorted(cost, tuning.READ_AHEAD.ahead_bytes, side="right"))
        last = int(np.searchsorted(bounds, stop, side="right")) - 1  # the last batch that fits ends there
        if last - k < 2:
            return None
        stop = int(bounds[last])
        offsets = self._offset[a:stop]
        if runs:
            # A run's records are entries 0, 1, ... of its small shard (offsets name
            # entries in the window's errors too).
            offsets = offsets.copy()
            in_window = self._shard[a:stop]
            for shard, got in runs.items():
                offsets[in_window == shard] -= got.run or 0

        def source(g: int) -> SampleSource:
            got = runs.get(g)
            return got.reader if got is not None else self._installed.reader(g)

        try:
            ahead = decode_ahead(self._smap.layouts, source, self._shard[a:stop], offsets, a, done)
        except AstreamError:
            ahead = None  # read batch by batch: the error comes with the batch it belongs to
        if ahead is None:
            self._ahead_off_until = stop
            return None
        self._pages.touched(self._shard[a:stop])
        self._ahead = ahead
        self._ahead_batches = min(2 * self._ahead_batches, tuning.READ_AHEAD.window)
        return ahead

    def _in_runs_until(self, a: int, readable: int, want: int, runs: dict[int, PeekedRecords]) -> int:
        """The first position of ``a:want`` a window may not read: one of a shard of ``runs``
        outside its run, or of another shard at or past ``readable`` (a lease not ready)."""
        shards, offsets = self._shard[a:want], self._offset[a:want]
        in_run = np.zeros(len(shards), bool)
        covered = np.zeros(len(shards), bool)
        for shard, got in runs.items():
            mine = shards == shard
            in_run |= mine
            covered[mine] = got.run_covers(offsets[mine])
        ok = np.where(in_run, covered, np.arange(a, want) < readable)
        bad = np.flatnonzero(~ok)
        return a + int(bad[0]) if len(bad) else want

    def read_each(self, a: int, b: int, peeked: dict[int, PeekedRecords]) -> list[dict[str, Any]]:
        return [self.reader(int(self._shard[i]), peeked).get(int(self._offset[i])) for i in range(a, b)]


def read_positions(shards: Int64Array, offsets: Int64Array,
                   source_of: Callable[[int], SampleSource | PeekedRecords]) -> dict[str, Any]:
    """The batch of records ``offsets`` of ``shards`` (position by position), each shard read
    through ``source_of(shard)``: one ``get_batch`` for one shard, else one gather."""
    if shards[0] == shards[-1] and (shards == shards[0]).all():
        return source_of(int(shards[0])).get_batch(offsets)
    found, groups = group_positions(shards)
    uniq = found.tolist()
    return gather_batch([source_of(g) for g in uniq], groups, [offsets[idx] for idx in groups], len(shards),
                        f"shards {uniq}")
