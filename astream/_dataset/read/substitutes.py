"""The reader's one substitution point for bad samples (``on_bad_sample="skip"``).

:class:`Substitutes` makes a batch the way the reader always does and steps in only where
that fails with an error the policy calls a bad sample (:mod:`astream._dataset.quarantine`),
or where the batch holds a sample known to be bad (met before: in this epoch, an
earlier one, the resumed state, or a quarantine file), which it never reads. Then it reads
the batch's positions one by one to find the bad ones, puts a substitute in each
(:mod:`astream._sampling.substitute` has the rule), and hands the batch on as a
:class:`~astream._dataset.quarantine.Substituted` carrying the records, which the
consumer counts against the budget and keeps in the state dict.

A shard that cannot be had at all (its hash fails after a fresh download, its bytes do not
decompress, its file does not open) makes every sample of it bad: its lease is marked
passed and none of its records is read. Each bad sample is logged once per process, when
it is found (a whole shard: one line for the shard, its samples at DEBUG).

Chosen once, when the reader is made: with ``on_bad_sample="raise"`` there is no
Substitutes and the reader's path is what it always was.
"""

from __future__ import annotations

import asyncio
import functools
import logging
from collections.abc import Awaitable, Callable
from typing import Any

import numpy as np
import numpy.typing as npt

from astream._coord.client import AsyncNodeClient
from astream._dataset.layout import SampleMap
from astream._dataset.observe.timings import STAGES
from astream._dataset.quarantine import BadSample, BadSamplePolicy, Substituted
from astream._dataset.read.assembly import Assembly, read_positions
from astream._dataset.read.collate import collate_samples
from astream._dataset.read.records import PeekedRecords
from astream._dataset.read.requests import LeaseRequests
from astream._dataset.read.samples import SampleSteps, apply_batch_transform
from astream._dataset.read.shards import OpenShards
from astream._format.kinds import SampleSource
from astream._node.provider import shard_key
from astream._sampling.substitute import in_batch, outside
from astream.errors import BadDataError

__all__ = ["BadSamples", "ReaderSide", "Substitutes", "repeat_rows"]

log = logging.getLogger("astream.dataset")

Int64Array = npt.NDArray[np.int64]
BadSamples = tuple[BadSamplePolicy, frozenset[int]]  # what a reader is given in skip mode
CAUSE_CHARS = 300  # of an error's message kept in a record


class ReaderSide:
    """What :class:`Substitutes` reads of the reader: a mixin of
    :class:`~astream._dataset.read.reader.EpochReader`, whose state it names here."""

    ids: Int64Array  # the worker's sequence of global sample ids
    _unleased: Int64Array | None = None  # positions never read (known bad, or of a lost shard)
    _at = 0  # the first position of the batch being read
    _shard: Int64Array
    _offset: Int64Array
    _steps: SampleSteps | None
    _batch_transform: Callable[[Any], Any] | None
    _smap: SampleMap
    _node: AsyncNodeClient
    _shards: OpenShards
    _leases: LeaseRequests
    _assembly: Assembly

    async def _fetch(self, a: int, b: int) -> dict[int, PeekedRecords]:
        raise NotImplementedError

    async def _batch(self, a: int, b: int, peeked: dict[int, PeekedRecords], collate: Any,
                     k: int | None = None) -> Any:
        raise NotImplementedError

    async def _read(self, read: Callable[..., Awaitable[Any]], a: int, b: int, *extra: Any) -> Any:
        raise NotImplementedError

    async def _samples(self, a: int, b: int, peeked: dict[int, PeekedRecords]) -> list[Any]:
        raise NotImplementedError

    def rows(self, positions: Int64Array, peeked: dict[int, PeekedRecords]) -> dict[str, Any]:
        """Positions ``positions`` as one batch, read column-wise."""
        return read_positions(self._shard[positions], self._offset[positions],
                              functools.partial(self._assembly.reader, peeked=peeked))

    @property
    def shards_of(self) -> Int64Array:
        return self._shard

    def _readable_until(self, stop: int) -> int:
        """The leases' answer, or the first position from the current batch on that is never
        read (a window of batches decoded at once must end before it: its shard has no path)."""
        stop = self._leases.readable_until(stop)
        unleased = self._unleased
        if unleased is not None and (nxt := int(np.searchsorted(unleased, self._at))) < len(unleased):
            return min(stop, int(unleased[nxt]))
        return stop

    async def fetch(self, a: int, b: int) -> dict[int, PeekedRecords]:
        return await self._fetch(a, b)

    async def batch(self, a: int, b: int, peeked: dict[int, PeekedRecords], collate: Any, k: int | None) -> Any:
        self._at = a
        return await self._read(self._batch, a, b, collate, k)  # (the reader's path, its refetch too)

    def drop_failed(self, stop: int, accept: Callable[[BaseException], bool]) -> dict[int, BaseException]:
        """Leases starting before ``stop`` whose request failed with an error ``accept``
        takes: each is marked passed (its shard is never read), its shard returned with it."""
        out: dict[int, BaseException] = {}
        loop = asyncio.get_running_loop()
        leases = self._leases
        for lease in range(len(leases.book)):
            if leases.book.start[lease] >= stop:
                break
            future = leases.ready[lease]
            if future.done() and not future.cancelled() and (exc := future.exception()) is not None and accept(exc):
                passed: asyncio.Future[str] = loop.create_future()
                passed.set_result("")
                leases.ready[lease] = passed
                shard = int(leases.book.shard[lease])
                lost = np.flatnonzero(self._shard == shard)
                self._unleased = lost if self._unleased is None else np.union1d(self._unleased, lost)
                out[shard] = exc
        return out

    def open_source(self, shard: int, peeked: dict[int, PeekedRecords]) -> SampleSource | PeekedRecords:
        return self._assembly.reader(shard, peeked)

    def record(self, position: int, peeked: dict[int, PeekedRecords]) -> dict[str, Any]:
        return self._assembly.reader(int(self._shard[position]), peeked).get(int(self._offset[position]))

    async def sample(self, position: int, peeked: dict[int, PeekedRecords]) -> Any:
        return (await self._samples(position, position + 1, peeked))[0]

    async def alone(self, position: int, as_sample: bool) -> Any:
        """Position ``position`` read by itself, its shard pinned meanwhile (a stand-in from
        outside the batch): a sample, or a batch of one row."""
        shard, offset = int(self._shard[position]), int(self._offset[position])
        key = shard_key(self._smap.shard_stream[shard], self._smap.shard_local[shard])
        path = await self._node.ensure(key, pin=True)
        try:
            source = self._shards.get(shard, path)
            if not as_sample:
                return source.get_batch(np.asarray([offset], np.int64))
            steps = self._steps
            if steps is None:
                return source.get(offset)
            sample_id = int(self.ids[position])

            def lookup(i: int) -> dict[str, Any] | None:
                return source.get(offset) if i == sample_id else None

            return (await asyncio.get_running_loop().run_in_executor(None, steps.run, [sample_id], lookup))[0]
        finally:
            await self._node.unpin(key)

    async def finish(self, batch: Any) -> Any:
        """A batch made by stand-ins, through the loader's batch transform."""
        if self._batch_transform is not None:
            with STAGES.timed("transform"):
                batch = await asyncio.get_running_loop().run_in_executor(None, apply_batch_transform,
                                                                         self._batch_transform, batch)
        return batch


def repeat_rows(batch: Any, rows: Int64Array) -> Any:
    """Rows ``rows`` of a column-wise batch (a dict of arrays and lists), in that order."""
    out: dict[str, Any] = {}
    for key, column in batch.items():
        if isinstance(column, np.ndarray):
            out[key] = column[rows]
        else:
            values = list(column)
            out[key] = [values[i] for i in rows.tolist()]
    return out


class Substitutes:
    """Substitutes for the bad samples of one reader's batches.

    Args:
        reader: the reader whose batches it makes.
        policy: the dataset's policy (``skips``).
        smap: where each sample lives (to name its shard file).
        skipped: ids known to be bad before this reader starts: never read.
    """

    def __init__(self, reader: ReaderSide, policy: BadSamplePolicy, smap: SampleMap, skipped: frozenset[int]) -> None:
        self._reader = reader
        self._policy = policy
        self._smap = smap
        self._known: dict[int, BadSample] = {
            i: BadSample(i, self._shard_file(i), "listed", "in the quarantine") if i in policy.listed
            else BadSample(i, self._shard_file(i), "known", "met before") for i in skipped}
        self._known_ids = np.fromiter(sorted(skipped), np.int64, len(skipped))
        self._bad_shards: dict[int, tuple[str, str]] = {}  # global shard -> (reason, cause)

    def _shard_file(self, sample: int) -> str:
        shard, _ = self._smap.locate_one(sample)
        return self._smap.indexes[self._smap.shard_stream[shard]].shards[self._smap.shard_local[shard]].raw_data.basename

    @classmethod
    def attach(cls, reader: ReaderSide, bad_samples: BadSamples | None,
               smap: SampleMap) -> tuple[Substitutes | None, Int64Array]:
        """The reader's substitutes (None with ``on_bad_sample="raise"``) and the shard to
        lease for each of its positions (:meth:`lease_shards`)."""
        if bad_samples is None:
            return None, reader._shard
        subs = cls(reader, bad_samples[0], smap, bad_samples[1])
        return subs, subs.lease_shards(reader._shard)

    def lease_shards(self, shards: Int64Array) -> Int64Array:
        """The shard to lease for each position: its own, except for positions known to be bad
        (never read), which take the one before them (so they ask for nothing of their own).
        ``shards`` itself when nothing is known."""
        known = self._known_ids
        if not len(known):
            return shards
        bad = np.isin(self._reader.ids, known)
        if not bad.any() or bad.all():
            return shards
        position = np.where(bad, -1, np.arange(len(shards)))
        position = np.maximum.accumulate(position)
        position[position < 0] = int(np.flatnonzero(~bad)[0])
        out: Int64Array = shards[position]
        self._reader._unleased = np.flatnonzero(out != shards)
        return out

    def _accept(self, exc: BaseException) -> bool:
        return self._policy.reason(exc) is not None

    async def batch(self, a: int, b: int, collate: Any, k: int | None) -> Any:
        """Positions ``a:b`` as the reader makes them, or with stand-ins for its bad samples."""
        reader = self._reader
        peeked = await self._fetch(a, b)
        if not self._holds_known(a, b):
            try:
                return await reader.batch(a, b, peeked, collate, k)
            except Exception as exc:
                if self._policy.reason(exc) is None:
                    raise
        return await self._substituted(a, b, peeked, collate)

    async def _fetch(self, a: int, b: int) -> Any:
        """Make ``a:b`` readable; a shard whose lease failed for a bad-data reason is lost."""
        while True:
            try:
                return await self._reader.fetch(a, b)
            except Exception as exc:
                if self._policy.reason(exc) is None:
                    raise
                dropped = self._reader.drop_failed(b, self._accept)
                if not dropped:
                    raise
                for shard, error in dropped.items():
                    self._lose_shard(shard, error)

    def _lose_shard(self, shard: int, error: BaseException) -> None:
        if shard in self._bad_shards:
            return
        reason = self._policy.reason(error) or "decode"
        cause = _cause(error)
        self._bad_shards[shard] = (reason, cause)
        info = self._smap.indexes[self._smap.shard_stream[shard]].shards[self._smap.shard_local[shard]]
        mine = self._reader.ids[self._reader.shards_of == shard]
        # Known lost (an earlier epoch, the state): its samples are not read, nor reported again.
        level = logging.DEBUG if bool(np.isin(mine, self._known_ids).all()) else logging.WARNING
        log.log(level, "astream: on_bad_sample='skip': shard %s is unreadable, all its %d samples are bad (%s): %s",
                    info.raw_data.basename, info.samples, reason, cause)

    def _holds_known(self, a: int, b: int) -> bool:
        reader = self._reader
        if self._bad_shards and np.isin(reader.shards_of[a:b], list(self._bad_shards)).any():
            return True
        known = self._known_ids
        return bool(len(known)) and bool(np.isin(reader.ids[a:b], known).any())

    def _known_bad(self, position: int) -> BadSample | None:
        sample = int(self._reader.ids[position])
        got = self._known.get(sample)
        if got is not None:
            return got
        shard = int(self._reader.shards_of[position])
        lost = self._bad_shards.get(shard)
        if lost is not None:
            record = BadSample(sample, self._shard_file(sample), *lost)
            log.debug("astream: on_bad_sample='skip': %s", record.describe())
            self._note(record)
            return record
        return None

    def _note(self, record: BadSample) -> None:
        self._known[record.sample] = record
        self._known_ids = np.union1d(self._known_ids, np.asarray([record.sample], np.int64))

    def _found(self, position: int, exc: BaseException) -> BadSample:
        sample = int(self._reader.ids[position])
        reason = self._policy.reason(exc)
        assert reason is not None
        record = BadSample(sample, self._shard_file(sample), reason, _cause(exc))
        log.warning("astream: on_bad_sample='skip': %s; a substitute takes its place", record.describe())
        self._note(record)
        return record

    def _check_shard(self, shard: int, peeked: Any) -> bool:
        """Whether ``shard`` opens (a shard that does not is lost whole)."""
        if shard in self._bad_shards:
            return False
        try:
            self._reader.open_source(shard, peeked)
        except Exception as exc:
            if self._policy.reason(exc) is None:
                raise
            self._lose_shard(shard, exc)
            return False
        return True

    async def _substituted(self, a: int, b: int, peeked: Any, collate: Any) -> Any:
        reader = self._reader
        as_sample = reader._steps is not None or collate is not None  # (else read column-wise)
        bad: dict[int, BadSample] = {}
        values: dict[int, Any] = {}
        opened: set[int] = set()
        for i in range(a, b):
            known = self._known_bad(i)
            if known is not None:
                bad[i] = known  # (never read: its shard may not even be leased)
                continue
            shard = int(reader.shards_of[i])
            if shard not in opened:
                opened.add(shard)
                self._check_shard(shard, peeked)
            lost = self._known_bad(i)  # (its shard did not open: lost whole)
            if lost is not None:
                bad[i] = lost
                continue
            try:
                if as_sample:
                    values[i] = await reader.sample(i, peeked)
                else:
                    reader.record(i, peeked)  # (decoded to find it bad; the batch is read column-wise below)
            except Exception as exc:
                if self._policy.reason(exc) is None:
                    raise
                bad[i] = self._found(i, exc)
        flags = np.asarray([i in bad for i in range(a, b)], np.bool_)
        src = in_batch(flags)
        if src is None:
            stand_in = await self._outside(a, b, as_sample)
            src = np.zeros(b - a, np.int64)
            if as_sample:
                samples = [stand_in] * (b - a)
            else:
                rows = stand_in
        elif as_sample:
            samples = [values[a + int(s)] for s in src.tolist()]
        else:
            good = np.flatnonzero(~flags)
            rows = reader.rows(a + good, peeked)
            src = np.searchsorted(good, src).astype(np.int64)
        batch = (collate or collate_samples)(samples) if as_sample else repeat_rows(rows, src)
        batch = await reader.finish(batch)
        return Substituted(batch, tuple(bad[i] for i in sorted(bad)))

    async def _outside(self, a: int, b: int, as_sample: bool) -> Any:
        """Rule 2: one good sample of the worker's sequence outside ``a:b`` (the nearest
        later, else the nearest earlier)."""
        reader = self._reader
        for p in outside(a, b, len(reader.ids)):
            if self._known_bad(p) is not None:
                continue
            try:
                return await reader.alone(p, as_sample)
            except Exception as exc:
                if self._policy.reason(exc) is None:
                    raise
                self._found(p, exc)
        first = int(reader.ids[a])
        raise BadDataError(
            f"every sample this reader has is bad ({self._shard_file(first)} and the others of its sequence): "
            "nothing can stand in for them; repair the shards (`astream verify DATASET --report` lists them)"
        )


def _cause(exc: BaseException) -> str:
    return f"{type(exc).__name__}: {exc}"[:CAUSE_CHARS]  # (astream's messages name their cause)
