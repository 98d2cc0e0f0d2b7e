"""The source seam: where a batch's records come from, one protocol and one race.

The main path reads every record from its shard's installed file (:class:`InstalledFile`,
memory-mapped: the fallback that always works, and the only source of every later
epoch). While a shard's lease is still pending, an early source may serve its records
first; each is a :class:`ShardSource` whose :meth:`~ShardSource.attempt` starts without
blocking and is raced against the lease by :func:`race` (the installed file wins whenever
it is first):

- :class:`DecodedOffers`: a decoding made before the install (a resume's first row groups,
  :mod:`astream._dataset.start.preopen`), offered to the process's open shards;
- :class:`~astream._dataset.read.arriving.ArrivingShards`: the records already written to
  the shard's arriving file;
- :class:`~astream._dataset.read.peek.RemotePeek`: ranged reads of the remote through the
  one :class:`~astream._dataset.read.ranged.RangedReader`.

Which of them apply is :mod:`astream._dataset.read.policy`'s decision (once per dataset and
shard, and per reader); whatever they serve is noted in the reader's
:class:`~astream._dataset.read.ledger.ServedLedger` and checked against the installed file.
"""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from astream._dataset.layout import SampleMap
from astream._dataset.read.arriving import ArrivingShards
from astream._dataset.read.peek import RemotePeek
from astream._dataset.read.policy import EarlyTurns
from astream._dataset.read.records import PeekedRecords
from astream._dataset.read.shards import OpenShards
from astream._format.kinds import SampleSource

__all__ = ["Attempt", "DecodedOffers", "EarlySources", "InstalledFile", "ShardSource", "race"]

Int64Array = npt.NDArray[np.int64]

# The records of every shard asked for (by shard), or None: the source cannot serve them all.
Attempt = Awaitable["dict[int, PeekedRecords] | None"]


class ShardSource(Protocol):
    """Where the records of a batch's shards may come from."""

    def attempt(self, want: Mapping[int, Int64Array]) -> Attempt | None:
        """Start reading records ``want[shard]`` of each shard of ``want``, without blocking
        (the reading runs in the awaitable returned); None where this source cannot serve
        them all now. The awaitable's None: it could not after all (a failure, a budget)."""
        ...


async def race(attempt: Attempt, leases: Sequence[asyncio.Future[Any]]) -> dict[int, PeekedRecords] | None:
    """``attempt``'s records if they come before every lease of ``leases`` resolved, else None
    (the leases were first: read the installed files); the attempt is cancelled if it lost."""
    task = asyncio.ensure_future(attempt)
    # Its outcome is read below or not at all (cancelled: a CancelledError nobody wants).
    task.add_done_callback(_retrieve)
    try:
        waiting: set[asyncio.Future[Any]] = {task, *leases}
        while task in waiting and any(f in waiting for f in leases):
            _, waiting = await asyncio.wait(waiting, return_when=asyncio.FIRST_COMPLETED)
        if task.done() and not task.cancelled() and task.exception() is None:
            return task.result()
        return None
    finally:
        task.cancel()  # (still running: the leases were first)


class InstalledFile:
    """The main path: records from the shards' installed files (read-only memory maps).

    Args:
        shards: the process's open shards.
        paths: per shard, the installed file of its ready lease.
    """

    def __init__(self, shards: OpenShards, paths: Mapping[int, str]) -> None:
        self._shards = shards
        self._paths = paths

    def reader(self, shard: int) -> SampleSource:
        """``shard``'s installed file, opened (its lease must be ready)."""
        return self._shards.get(shard, self._paths[shard])

    def attempt(self, want: Mapping[int, Int64Array]) -> Attempt | None:
        if not all(shard in self._paths for shard in want):
            return None
        done: asyncio.Future[dict[int, PeekedRecords] | None] = asyncio.get_running_loop().create_future()
        done.set_result({shard: _whole(self.reader(shard)) for shard in want})
        return done


class DecodedOffers:
    """Shards decoded before their install and offered to the process's open shards.

    Args:
        smap: the dataset's shards.
        shards: the process's open shards (the offers).
    """

    def __init__(self, smap: SampleMap, shards: OpenShards) -> None:
        self._smap = smap
        self._shards = shards
        self.digests: dict[int, int] = {}  # per shard served, the xxh3-64 of the bytes decoded

    def attempt(self, want: Mapping[int, Int64Array]) -> Attempt | None:
        offers = {shard: self._shards.offered(shard) for shard in want}
        if not offers or any(f is None for f in offers.values()):
            return None
        return self._decoded({shard: f for shard, f in offers.items() if f is not None})

    async def _decoded(self, offers: Mapping[int, Any]) -> dict[int, PeekedRecords] | None:
        # A failed decoding raises: the race reads that as "the leases serve". Shielded: a
        # race lost leaves the decodings to finish (the installed file's reader may adopt them).
        decoded = await asyncio.gather(*(asyncio.shield(asyncio.wrap_future(f)) for f in offers.values()))
        out: dict[int, PeekedRecords] = {}
        for shard, (reader, digest) in zip(offers, decoded, strict=True):
            samples = self._smap.indexes[self._smap.shard_stream[shard]].shards[self._smap.shard_local[shard]].samples
            out[shard] = PeekedRecords(reader, np.arange(samples, dtype=np.int64), [])
            self.digests[shard] = digest
        return out


@dataclass
class EarlySources:
    """One reader's early sources, as its :class:`~astream._dataset.read.policy.EarlyTurns` allow.

    Attributes:
        turns: which sources the reader still uses.
        ranged: ranged reads of the remote (None: no shard of the dataset may be).
        arriving: reads of arriving files (None: no shard of the dataset may be).
    """

    turns: EarlyTurns
    ranged: RemotePeek | None
    arriving: ArrivingShards | None

    async def aclose(self) -> None:
        try:
            if self.ranged is not None:
                await self.ranged.aclose()
        finally:
            if self.arriving is not None:
                self.arriving.close()  # also when this close is cancelled itself (a loop shutting down)


def _whole(reader: SampleSource) -> PeekedRecords:
    return PeekedRecords(reader, np.arange(reader.num_samples, dtype=np.int64), [])


def _retrieve(future: asyncio.Future[Any]) -> None:
    if not future.cancelled():
        future.exception()
