"""Shared-memory slabs a worker reuses for its batches' large buffers, and their leases.

Measured on 3.2 MB batches (32 x 100 KB): a fresh anonymous file per batch costs
~1.9 ms to create and fill (the kernel allocates and clears every page) and ~0.3 ms
to map and unmap on the consumer's side; copying the same bytes into memory that is
already mapped and populated costs ~0.07 ms. So a worker keeps a ring of slots, each
an anonymous file (``memfd_create``) mapped once on both sides with its pages
populated, and copies a batch's large buffers into a free slot: one copy, into warm
memory; the consumer rebuilds the arrays over its mapping of the slot, no copy at all.

Ownership, so that a batch the user still holds is never overwritten: a slot the
worker fills is the consumer's until every array and view over it is gone. The
consumer hands out each batch over a *lease* (a ctypes array over the slot's mapping,
which every array rebuilt over the slot references); when the lease is collected —
at once, by reference counting, when the last array of the batch goes — its
finalizer sends the slot's number back over the socket beside the pipe (one byte,
:func:`release_byte`), and only then may the worker fill the slot again. A worker
that finds no free slot makes a new one (up to :data:`MAX_SLOTS` and
:data:`MAX_RING_BYTES`), and past that sends the batch the slower way (a fresh file
per buffer, or the pipe): holding any number of batches (``list(loader)``) never
stalls the worker and never overwrites one.

Lifetimes: the worker's mappings go with its process. The consumer closes each
slot's descriptor as soon as it is mapped; its mapping lives while the worker's
:class:`SlabViews` or a lease refers to it (``close()`` drops the former, the user's
last array of a batch the latter).

Small batches (a pickle of tens of KB, no large buffer) take another way:
:class:`MessageRing`, one shared-memory ring per worker that the pickles follow each other
in. A pipe costs a small batch ~10 µs of CPU on each side that memory does not (the
kernel allocates, fills, wakes and frees pipe pages: ~45 against ~32 µs a batch, pickling
included, ``benchmarks/handoff_floor_bench.py``). The pipe still carries every message's
head, in order; the consumer unpickles the ring's bytes in place (unpickling copies every
value out) and then marks them read in the ring's header, which is all the worker needs
to reuse them: no message back. A pickle that finds no room goes through the pipe.
"""

from __future__ import annotations

import contextlib
import ctypes
import os
import platform
import socket
import threading
import weakref
from collections.abc import Sequence
from dataclasses import dataclass

from astream._dataset.transport.mapping import MappingError, map_file

__all__ = [
    "MAX_RING_BYTES", "MAX_SLOTS", "MESSAGE_MIN_BYTES", "MESSAGE_RING_BYTES", "SLAB_MIN_BYTES", "MessageRing",
    "RingSlot", "SlabRing", "SlabViews", "is_release", "layout", "release_byte",
]

# Buffers this large or larger go into a slot (smaller ones cross the pipe: two small
# copies cost less than a lease and its release message).
SLAB_MIN_BYTES = 64 * 1024
# Slots per worker, and the bytes they may take together.
MAX_SLOTS = 16
MAX_RING_BYTES = 512 * 1024 * 1024
_ALIGN = 64  # each buffer starts on a cache line: the arrays over it are aligned
_RELEASE = 0x80
# A worker's ring of small pickles (a few dozen batches of ~1 KB records), and the
# smallest pickle that goes there (an "end", an error report: the pipe, as before).
MESSAGE_RING_BYTES = 4 << 20
MESSAGE_MIN_BYTES = 4096
# The ring's first cache line: the consumer's count of the ring's bytes read ("freed"),
# a count that only grows, as the worker's count of bytes written does.
_RING_HEADER = 64
# The consumer stores its count after reading the bytes it frees, with no fence between
# (Python has none to issue): on x86 a store is never seen before earlier loads (total
# store order); a weakly ordered CPU (ARM) may let the worker overwrite bytes still being
# read, so there the small batches take the pipe.
_ORDERED_STORES = platform.machine().lower() in {"x86_64", "amd64", "i386", "i686"}


def release_byte(slot: int) -> bytes:
    """The byte that gives slot ``slot`` back to the worker."""
    return bytes([_RELEASE | slot])


def is_release(byte: int) -> bool:
    return bool(byte & _RELEASE)


def layout(sizes: Sequence[int]) -> tuple[list[int], int]:
    """The offsets of buffers of ``sizes`` laid out in one slot, and the bytes they need."""
    offsets, at = [], 0
    for size in sizes:
        offsets.append(at)
        at += -(-size // _ALIGN) * _ALIGN
    return offsets, at


@dataclass
class RingSlot:
    """A slot taken for one batch: its number, its memory, its file when it is new."""

    slot: int
    memory: memoryview
    size: int
    new_fd: int | None  # the slot's file, sent (and closed) with this batch; None: known already


@dataclass
class _Slot:
    pages: ctypes.Array[ctypes.c_ubyte]
    size: int
    busy: bool = False


class SlabRing:
    """The worker's side: its slots, which of them the consumer holds."""

    def __init__(self, max_slots: int = MAX_SLOTS, max_bytes: int = MAX_RING_BYTES) -> None:
        self._slots: list[_Slot] = []
        self._max_slots = min(max_slots, _RELEASE)
        self._max_bytes = max_bytes
        self.failed = False  # a slot could not be made here: stop trying

    @property
    def busy(self) -> int:
        return sum(s.busy for s in self._slots)

    def release(self, slot: int) -> None:
        if 0 <= slot < len(self._slots):
            self._slots[slot].busy = False

    def take(self, nbytes: int) -> RingSlot | None:
        """A free slot of at least ``nbytes`` (made if need be), or None: send another way."""
        free = [(s.size, i) for i, s in enumerate(self._slots) if not s.busy and s.size >= nbytes]
        if free:
            _, i = min(free)
            slot = self._slots[i]
            slot.busy = True
            return RingSlot(i, memoryview(slot.pages).cast("B"), slot.size, None)
        if self.failed or len(self._slots) >= self._max_slots:
            return None
        if sum(s.size for s in self._slots) + nbytes > self._max_bytes:
            return None
        try:
            fd = os.memfd_create("astream-slab", os.MFD_CLOEXEC)
        except (OSError, AttributeError):
            self.failed = True
            return None
        try:
            os.ftruncate(fd, nbytes)
            pages = map_file(fd, nbytes)  # populated now: the first batch pays the faults once
        except (OSError, MappingError):
            os.close(fd)
            self.failed = True
            return None
        self._slots.append(_Slot(pages, len(pages), busy=True))
        return RingSlot(len(self._slots) - 1, memoryview(pages).cast("B"), len(pages), fd)


def _counter(pages: ctypes.Array[ctypes.c_ubyte]) -> ctypes.c_uint64:
    """The ring header's count of bytes read, as one aligned 8-byte word: ctypes reads and
    writes it with one load or store, so the worker never sees half of a new count
    (``struct`` packs a byte at a time: a count read while being written could look larger
    than it is, and the worker would reuse bytes not read yet)."""
    return ctypes.c_uint64.from_buffer(pages, 0)  # (offset 0 of a mapping: page aligned)


class MessageRing:
    """The worker's side of its ring of small pickles (made at the first one that goes there)."""

    def __init__(self, size: int = MESSAGE_RING_BYTES, ordered: bool = _ORDERED_STORES) -> None:
        self._size = size
        self._pages: ctypes.Array[ctypes.c_ubyte] | None = None
        self._view: memoryview | None = None
        self._freed: ctypes.c_uint64 | None = None  # the consumer's count, in the header
        self._written = 0  # bytes of the ring used so far, skipped ends included
        # No ring here (none could be made, or this CPU may reorder the consumer's count
        # before its reads): the pipe for everything.
        self.failed = not ordered

    @property
    def room(self) -> int:
        """The ring's capacity (its bytes past the header)."""
        return self._size - _RING_HEADER

    def place(self, payload: bytes) -> tuple[int, int, int | None] | None:
        """Copy ``payload`` into the ring: (where, the written count after it, the ring's file
        if this is its first use, to send and close), or None (no room now, too small or
        too large, or no ring here): send it through the pipe."""
        size = len(payload)
        if size < MESSAGE_MIN_BYTES or size > self.room // 4 or self.failed:
            return None
        new_fd = None
        if self._view is None:
            new_fd = self._make()
            if new_fd is None:
                return None
        assert self._view is not None
        at = self._written % self.room
        skip = self.room - at if at + size > self.room else 0  # no room before the end: at 0
        assert self._freed is not None
        freed = self._freed.value  # one 8-byte load (see _counter)
        if self._written + skip + size - freed > self.room:
            return None  # the consumer holds the room still (with its file unsent: none yet)
        if skip:
            self._written += skip
            at = 0
        self._view[_RING_HEADER + at : _RING_HEADER + at + size] = payload
        self._written += size
        return at, self._written, new_fd

    def abandon(self) -> None:
        """The ring's file could not be sent: use the pipe from now on."""
        self.failed = True

    def _make(self) -> int | None:
        try:
            fd = os.memfd_create("astream-messages", os.MFD_CLOEXEC)
        except (OSError, AttributeError):
            self.failed = True
            return None
        try:
            os.ftruncate(fd, self._size)
            self._pages = map_file(fd, self._size)
        except (OSError, MappingError):
            os.close(fd)
            self.failed = True
            return None
        self._view = memoryview(self._pages).cast("B")[: self._size]
        self._freed = _counter(self._pages)
        return fd

    @property
    def size(self) -> int:
        """The ring's file's size (what the consumer maps)."""
        return self._size


class SlabViews:
    """The consumer's side of one worker's ring: its mappings, and the leases of its batches.

    ``channel`` is the consumer's end of the socket beside the worker's pipe; releases
    are sent over it from whichever thread drops a batch's last array.
    """

    def __init__(self, channel: socket.socket) -> None:
        self._channel = channel
        self._maps: dict[int, ctypes.Array[ctypes.c_ubyte]] = {}
        self._messages: memoryview | None = None  # the worker's ring of small pickles, once announced
        self._freed: ctypes.c_uint64 | None = None  # its header's count of bytes read
        # Re-entrant: a collection can run a lease's finalizer inside any of these methods.
        self._lock = threading.RLock()
        self._closed = False

    def install(self, slot: int, fd: int, size: int) -> None:
        """Map the slot's file (the caller closes ``fd``)."""
        pages = map_file(fd, size)
        with self._lock:
            self._maps[slot] = pages

    def install_messages(self, fd: int, size: int) -> None:
        """Map the worker's ring of small pickles (the caller closes ``fd``)."""
        pages = map_file(fd, size)
        with self._lock:
            self._messages = memoryview(pages).cast("B")[:size]
            self._freed = _counter(pages)

    def message(self, at: int, size: int) -> memoryview | None:
        """The pickle at ``at`` of the worker's ring (read it before :meth:`message_read`);
        None if there is no ring here or it does not hold those bytes."""
        with self._lock:
            ring = self._messages
        if ring is None or not 0 <= at <= at + size <= ring.nbytes - _RING_HEADER:
            return None
        return ring[_RING_HEADER + at : _RING_HEADER + at + size]

    def message_read(self, end: int) -> None:
        """The ring's bytes up to the worker's count ``end`` are read: it may reuse them."""
        with self._lock:
            freed = self._freed
        if freed is not None:
            freed.value = end  # one 8-byte store (see _counter)

    def known(self, slot: int) -> bool:
        with self._lock:
            return slot in self._maps

    def lease(self, slot: int, nbytes: int) -> memoryview:
        """The first ``nbytes`` of slot ``slot``, given back to the worker when no longer referenced."""
        with self._lock:
            pages = self._maps[slot]
        view = (ctypes.c_ubyte * max(1, nbytes)).from_buffer(pages)  # references the mapping
        weakref.finalize(view, self._release, slot).atexit = False
        return memoryview(view).cast("B")[:nbytes]

    def _release(self, slot: int) -> None:
        with self._lock:
            if self._closed:
                return
            # One byte on a socket the worker drains at every batch: never full in
            # practice, and a release lost to a full or broken socket only costs the
            # worker a slot, never a batch.
            with contextlib.suppress(OSError):
                self._channel.send(release_byte(slot), socket.MSG_DONTWAIT)

    def close(self) -> None:
        """Stop sending releases (before the channel closes) and drop the mappings.

        A mapping stays until the last lease over it is gone: batches the user holds stay valid.
        """
        with self._lock:
            self._closed = True
            self._maps.clear()
            self._messages = None
            self._freed = None
