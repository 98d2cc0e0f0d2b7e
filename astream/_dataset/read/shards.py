"""The shards a process reads: open memory maps, their resident pages, and leases.

:class:`OpenShards` keeps this process's shard readers open (read-only memory maps) in
LRU order; :func:`drop_pages` hands a map's touched pages back to the kernel (they stay
in the page cache); :func:`~astream._dataset.read.leases.leases_of` groups a worker's sequence into the stretches for
which each shard is pinned (see :mod:`astream._dataset.read.reader`).

Every page of a map that a read touched counts in the process's RSS until it is unmapped.
:class:`ResidentPages` hands a reader's touched pages back (``MADV_DONTNEED``: the data
stays in the page cache and a later read maps it again) once ``resident_bytes`` (tuning.py) bytes
were read and when a lease ends, and :class:`OpenShards` right after a shard is opened
(opening validates every record's head), so what iterating holds is a few dozen
megabytes, not the shards it has read.
"""

from __future__ import annotations

import contextlib
import mmap
import threading
from collections import OrderedDict
from collections.abc import Iterable
from concurrent.futures import Future

import numpy as np
import numpy.typing as npt

from astream._arrays import sorted_unique
from astream._dataset import tuning
from astream._dataset.layout import SampleMap
from astream._dataset.read.ledger import same_bytes
from astream._format.kinds import SampleSource, held_bytes, open_shard

__all__ = ["OpenShards", "ResidentPages", "drop_pages"]

Int64Array = npt.NDArray[np.int64]

# A shard decoded ahead of its install, and the xxh3-64 of the bytes it was decoded from.
Decoded = tuple[SampleSource, int]


def drop_pages(reader: SampleSource) -> None:
    """Unmap the pages of ``reader``'s file from this process (they stay in the page cache)."""
    buf = reader.buffer
    if isinstance(buf, mmap.mmap) and not buf.closed:
        with contextlib.suppress(OSError, ValueError):
            buf.madvise(mmap.MADV_DONTNEED)


class OpenShards:
    """Readers of the shards this process reads, kept open (mmap) in LRU order."""

    def __init__(self, smap: SampleMap, max_open: int = 128) -> None:
        self._smap = smap
        self._max_open = max_open
        self._open: OrderedDict[int, SampleSource] = OrderedDict()
        self._held = 0  # bytes the open shards hold decoded
        # Shards being decoded from bytes read before their install (see offer).
        self._offered: dict[int, Future[Decoded]] = {}
        self._lock = threading.Lock()  # (offers come from another thread than the reads)

    def offer(self, shard: int, decoded: Future[Decoded]) -> None:
        """``decoded`` will hold ``shard`` decoded from bytes read before it was installed, and
        those bytes' xxh3-64 (a resume's first row group, decoded while the node agent starts;
        see :mod:`astream._dataset.start.preopen`). :meth:`get` takes that reader instead of
        decoding the installed file again, waiting for it if it is still being decoded, if
        the installed file holds exactly those bytes."""
        with self._lock:
            old = self._offered.pop(shard, None)
            self._offered[shard] = decoded
        if old is not None:
            _drop_offer(old)

    def offered(self, shard: int) -> Future[Decoded] | None:
        """The decoding offered for ``shard`` and not taken yet (see :meth:`offer`), or None."""
        with self._lock:
            return self._offered.get(shard)

    def withdraw_offers(self) -> None:
        """Drop the offers not taken (their readers, and memory, go with them)."""
        with self._lock:
            offered, self._offered = self._offered, {}
        for decoded in offered.values():
            _drop_offer(decoded)

    def _offered_for(self, shard: int, path: str) -> SampleSource | None:
        with self._lock:
            decoded = self._offered.pop(shard, None)
        if decoded is None:
            return None
        try:
            # The decode started before the shard was installed: what is left of it is
            # shorter than decoding the installed file from the start.
            reader, digest = decoded.result()
        except Exception:  # (a hint: the installed file is decoded, and reports its own errors)
            return None
        try:
            with open(path, "rb") as fh:
                same = same_bytes(digest, fh.read())  # (the ledger's one comparison)
        except OSError:
            same = False  # (opening it below reports what is wrong)
        if same:
            return reader
        reader.close()  # other bytes than the installed ones: decode the installed file
        return None

    def get(self, shard: int, path: str) -> SampleSource:
        reader = self._open.get(shard)
        if reader is not None:
            self._open.move_to_end(shard)
            return reader
        reader = self._offered_for(shard, path) if self._offered else None
        if reader is None:
            info = self._smap.indexes[self._smap.shard_stream[shard]].shards[self._smap.shard_local[shard]]
            reader = open_shard(path, self._smap.layouts[shard], info)
            drop_pages(reader)  # opening read the first chunk of record heads
        self._open[shard] = reader
        self._held += held_bytes(reader)
        while len(self._open) > self._max_open or (self._held > tuning.READ_AHEAD.decoded_bytes and len(self._open) > 1):
            # Dropped, not closed: a batch being decoded may still use it; the mapping
            # goes with the last reference.
            _, old = self._open.popitem(last=False)
            self._held -= held_bytes(old)
        return reader

    def drop_pages(self, shards: Iterable[int]) -> None:
        """Hand back the touched pages of these shards (those still open)."""
        for shard in shards:
            reader = self._open.get(shard)
            if reader is not None:
                drop_pages(reader)

    def close(self) -> None:
        self.withdraw_offers()
        readers = list(self._open.values())
        self._open.clear()
        self._held = 0
        for reader in readers:
            with contextlib.suppress(Exception):
                reader.close()


def _drop_offer(decoded: Future[Decoded]) -> None:
    def close(done: Future[Decoded]) -> None:
        if not done.cancelled() and done.exception() is None:
            done.result()[0].close()

    decoded.add_done_callback(close)  # (now if decoded already, else when it is)


class ResidentPages:
    """The pages of shard maps one reader touched, handed back every ``resident_bytes`` (tuning.py) bytes.

    Counts bytes as records of each shard's mean size (no per-record sums on the way).
    """

    def __init__(self, shards: OpenShards, mean_record: npt.NDArray[np.float64]) -> None:
        self._shards = shards
        self._mean_record = mean_record
        self._touched: set[int] = set()
        self._bytes = 0.0

    def touched(self, shards: Int64Array) -> None:
        """Records of ``shards`` (one entry per record read) were just read."""
        first = int(shards[0])
        if shards[-1] == first and (len(shards) == 1 or (shards == first).all()):
            self._touched.add(first)
            self._bytes += len(shards) * self._mean_record[first]
        else:
            self._touched.update(sorted_unique(shards).tolist())
            self._bytes += float(self._mean_record[shards].sum())
        if self._bytes >= tuning.READ_AHEAD.resident_bytes:
            self._shards.drop_pages(self._touched)
            self._touched.clear()
            self._bytes = 0.0

    def release(self, shard: int) -> None:
        """The reader is done with ``shard`` for now: hand its pages back at once."""
        if shard in self._touched:
            self._shards.drop_pages((shard,))
            self._touched.discard(shard)
