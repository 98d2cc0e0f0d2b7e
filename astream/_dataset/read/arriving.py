"""Records of a shard read from the cache's file while the shard is still arriving.

The engine writes a shard's raw bytes in order (as the body streams in, or as the
decompressor produces them) to a temporary file beside the final name, and renames it
only once it is complete and checked (:mod:`astream._cache.install`). A reader whose
next batch lies in such a shard does not have to wait for the rename: every byte below
the temporary file's size is written, so once the offset table and the records a batch
needs are there, they are read with ``pread`` and decoded as a small shard of their own
(:func:`~astream._dataset.read.records.small_shard`: the format layer's checks apply). Nothing
here ever writes, renames or trusts a file: what a later run finds in the cache is still
only what the engine renamed into place.

How it stays exact: the bytes handed out may come from a download that later fails its
checks (a size or decompression error), is started again from byte 0, or is replaced by
a second download, or from the remote by a ranged read (:mod:`astream._dataset.read.peek`).
So every span served (the offset table, and each run of records) is noted with its
xxh3 digest and the file it came from in the reader's
:class:`~astream._dataset.read.ledger.ServedLedger`, and when the shard's lease resolves it
is checked against the installed file, the one every check accepted
(:func:`~astream._dataset.read.ledger.check`; this module keeps the files served from open
until then, :meth:`ArrivingShards.sources`):

- spans read from the very file that was renamed into place (same device and inode) are
  the installed bytes by construction: the engine only appends to a temporary and never
  rewrites it (a transfer that starts again writes a new file), and the descriptor stays
  open until the check, so the inode cannot have been reused;
- any other span (an abandoned transfer's file, the remote) is hashed again from the
  installed file; a difference raises :class:`~astream.errors.ServedSamplesError` and
  the epoch stops. A download that fails for good raises its own error there.

The reader waits for these checks before an iteration ends, so an epoch never finishes
with an unchecked sample.

Where it does not apply (the reader waits for the shard, as before; decided by
:mod:`astream._dataset.read.policy`): streams with
``validate_hash`` (a sample must not be handed out before its file's digest is checked),
local datasets (nothing arrives), and readers of a bounded cache (they pin one batch at
a time; see :mod:`astream._dataset.read.reader`).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import struct
from collections.abc import Mapping

import numpy as np
import numpy.typing as npt
import xxhash

from astream._arrays import sorted_unique
from astream._cache.install import find_temporary, still_written
from astream._dataset import tuning
from astream._dataset.layout import SampleMap
from astream._dataset.read.installed import pread as _pread
from astream._dataset.read.ledger import FROM_SOURCE, Ident, Span
from astream._dataset.read.policy import ARRIVING, EarlyTurns
from astream._dataset.read.records import PeekedRecords, check_head, coalesce, small_shard
from astream._format.record import RecordLayout
from astream._format.shard import ShardReader
from astream.errors import ShardFormatError

__all__ = ["ArrivingShards"]

Int64Array = npt.NDArray[np.int64]
_U32 = np.dtype("<u4")



class _Open:
    """One temporary file being read: its descriptor and identity."""

    __slots__ = ("fd", "ident", "path")

    def __init__(self, path: str, fd: int) -> None:
        st = os.fstat(fd)
        self.path = path
        self.fd = fd
        self.ident = (st.st_dev, st.st_ino)


class ArrivingShards:
    """Reads records of shards that are still being written into this node's cache.

    Lives with one reader on one event loop; :meth:`close` releases its descriptors.

    Args:
        smap: where every global shard's records live and how they decode.
        turns: the reader's early sources (which shards may be read early, each one's cache
            path, and turning them off).
    """

    def __init__(self, smap: SampleMap, turns: EarlyTurns) -> None:
        self._smap = smap
        self._turns = turns
        self._open: dict[int, _Open] = {}
        self._heads: dict[int, Int64Array] = {}
        # Per shard, the files records were served from (kept open until the shard is checked).
        self._served: dict[int, set[Ident]] = {}
        # Descriptors of files served from, kept open until their shard is checked: an open
        # file's inode number is not given to another file meanwhile.
        self._kept: dict[int, list[int]] = {}
        self._head_span: dict[int, Span] = {}
        # Per shard, the run of arrived records read last: (first record, end, records).
        self._blocks: dict[int, tuple[int, int, PeekedRecords]] = {}

    def applies(self, shard: int) -> bool:
        return self._turns.applies(ARRIVING, shard)

    def attempt(self, want: Mapping[int, Int64Array]) -> asyncio.Future[dict[int, PeekedRecords] | None] | None:
        """The records ``want[shard]`` of each shard of ``want`` if their arriving files hold
        them now (a done future: see :class:`~astream._dataset.read.sources.ShardSource`), else None."""
        out: dict[int, PeekedRecords] = {}
        for shard, offsets in want.items():
            records = self.records(shard, offsets) if self.applies(shard) else None
            if records is None:
                return None
            out[shard] = records
        done: asyncio.Future[dict[int, PeekedRecords] | None] = asyncio.get_running_loop().create_future()
        done.set_result(out)
        return done

    def _file(self, shard: int) -> _Open | None:
        """The temporary file of ``shard`` now (None: not being written, or renamed already)."""
        if not self._turns.policy.arrives(shard):
            return None
        final = self._turns.policy.cache_path(shard)
        held = self._open.get(shard)
        if held is not None:
            if still_written(held.path, held.ident):
                return held
            self._drop(shard)  # renamed into place (the lease is a moment away) or given up
        path = find_temporary(final)
        if path is None:
            return None
        try:
            fd = os.open(path, os.O_RDONLY)
        except FileNotFoundError:
            return None
        held = _Open(path, fd)
        self._open[shard] = held
        # A new file: another download (the offset table is read again, and checked again).
        self._heads.pop(shard, None)
        self._blocks.pop(shard, None)
        self._head_span.pop(shard, None)
        return held

    def _drop(self, shard: int) -> None:
        held = self._open.pop(shard, None)
        if held is not None:
            if held.ident in self._served.get(shard, {}):
                self._kept.setdefault(shard, []).append(held.fd)
            else:
                os.close(held.fd)

    def _release(self, shard: int) -> None:
        for fd in self._kept.pop(shard, []):
            with contextlib.suppress(OSError):
                os.close(fd)

    def records(self, shard: int, offsets: Int64Array) -> PeekedRecords | None:
        """Records ``offsets`` of ``shard`` if its arriving file holds them already, else None."""
        if not self.applies(shard):
            return None
        try:
            return self._records(shard, offsets)
        except (OSError, ShardFormatError):
            # Unreadable, or a header that disagrees with index.json: wait for the download
            # (the shard's own checks then report what is wrong).
            self._turns.fail(ARRIVING, shard)
            self._drop(shard)
            return None

    def _records(self, shard: int, offsets: Int64Array) -> PeekedRecords | None:
        held = self._file(shard)
        if held is None:
            return None
        info = self._smap.indexes[self._smap.shard_stream[shard]].shards[self._smap.shard_local[shard]]
        size = os.fstat(held.fd).st_size
        head = self._heads.get(shard)
        if head is None:
            length = 4 + 4 * (info.samples + 1)
            if size < length:
                return None
            raw = _pread(held.fd, 0, length)
            if raw is None:
                return None
            (n,) = struct.unpack_from("<I", raw, 0)
            head = np.frombuffer(raw, _U32, info.samples + 1, 4).astype(np.int64)
            check_head(head, n, info.samples, info.raw_data.bytes, f"{held.path} (arriving)")
            self._heads[shard] = head
            self._head_span[shard] = (0, length, xxhash.xxh3_64_intdigest(raw))
        wanted = sorted_unique(offsets)
        first_wanted, last_wanted = int(wanted[0]), int(wanted[-1])
        block = self._blocks.get(shard)
        if block is not None and block[0] <= first_wanted and last_wanted < block[1]:
            return block[2]  # (read for an earlier batch with the records after it)
        if int(head[last_wanted + 1]) > size:
            return None
        # Records arrived in full: [0, arrived). Read a run of them from the first one
        # wanted, up to ``arriving_block`` bytes, and keep it for the next batches: a batch costs a
        # lookup, not a read and a small shard of its own (a sequential epoch reads on).
        arrived = int(np.searchsorted(head, size, side="right")) - 1
        upto = min(arrived, int(np.searchsorted(head, head[first_wanted]  + tuning.READ_AHEAD.arriving_block, side="right")) - 1)
        floor = min(tuning.READ_AHEAD.arriving_min_block, int(head[-1]) // 8, int(head[-1] - head[first_wanted]))
        if int(head[upto] - head[first_wanted]) < floor:
            # Wait for a little more: building a small shard costs ~0.3 ms, so one per
            # batch of small records would cost more than the wait it saves.
            return None
        keep = upto > last_wanted
        name = f"{held.path} (records of a shard still arriving)"
        if keep:
            records = self._run_of(shard, held, head, first_wanted, upto, name)
            if records is None:
                return None
            self._blocks[shard] = (first_wanted, upto, records)
            return records
        begin, end = head[wanted], head[wanted + 1]
        lo, hi = coalesce(begin, end)
        chunks: list[bytes] = []
        for a, b in zip(lo.tolist(), hi.tolist(), strict=True):
            first, stop = int(begin[a]), int(end[b - 1])
            data = _pread(held.fd, first, stop - first)
            if data is None:
                return None  # the file was cut short meanwhile (a restarted transfer)
            chunks.append(data)
        # The offset table these records were located with (read once for this file) is
        # checked with them: every batch served carries its span.
        records = small_shard(self._smap, shard, name, wanted, begin, end, lo, hi, chunks, [self._head_span[shard]])
        records.source = held.ident
        return records

    def _run_of(self, shard: int, held: _Open, head: Int64Array, first: int, upto: int,
                name: str) -> PeekedRecords | None:
        """Records ``first:upto`` (back to back in the file) as a small shard, read straight
        into its body: one copy, as a read through a memory map makes."""
        n = upto - first
        table = head[first : upto + 1] - head[first] + (4 + 4 * (n + 1))
        body = bytearray(int(table[-1]))
        struct.pack_into("<I", body, 0, n)
        body[4 : int(table[0])] = table.astype(_U32).tobytes()
        view = memoryview(body)[int(table[0]) :]
        offset = int(head[first])
        while view:
            got = os.preadv(held.fd, [view], offset)
            if got == 0:
                return None  # (cannot happen: the file only grows)
            view, offset = view[got:], offset + got
        layout = self._smap.layouts[shard]
        assert isinstance(layout, RecordLayout)  # (the source policy offers MDS shards only)
        reader = ShardReader(body, layout, name=name, shard=shard, expected_samples=n)
        records = PeekedRecords(reader, np.arange(first, upto, dtype=np.int64),
                                [self._head_span[shard], (int(head[first]), int(head[upto]), FROM_SOURCE)])
        records.source = held.ident
        records.run = first
        return records

    def note(self, shard: int, records: PeekedRecords) -> None:
        """Records of ``shard`` handed out early: their file stays open until :meth:`release`
        (an open file's inode number is not given to another file meanwhile)."""
        if records.source is not None:
            self._served.setdefault(shard, set()).add(records.source)

    def sources(self, shard: int) -> dict[Ident, int]:
        """The descriptors still open of the files ``shard`` was served from, by (device, inode)."""
        fds = list(self._kept.get(shard, []))
        held = self._open.get(shard)
        if held is not None:
            fds.append(held.fd)
        out: dict[Ident, int] = {}
        for fd in fds:
            with contextlib.suppress(OSError):
                st = os.fstat(fd)
                out[(st.st_dev, st.st_ino)] = fd
        return out

    def release(self, shard: int) -> None:
        """``shard`` is checked (or its download failed): its files served from may close."""
        self._served.pop(shard, None)
        self._blocks.pop(shard, None)
        self._release(shard)

    def forget(self, shard: int) -> None:
        """The download of ``shard`` failed: its early reads are moot (its error is raised)."""
        self._served.pop(shard, None)
        self._blocks.pop(shard, None)
        self._drop(shard)
        self._release(shard)

    def close(self) -> None:
        self._served.clear()
        self._blocks.clear()
        for shard in list(self._open):
            with contextlib.suppress(OSError):
                self._drop(shard)
        for shard in list(self._kept):
            self._release(shard)
