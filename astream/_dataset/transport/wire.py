"""The framing of a batch's messages: a :class:`~multiprocessing.connection.Connection`'s,
with a head that says where each buffer travels, and the reader that takes many at once.

A message is framed as a Connection frames it (a 4-byte length, or -1 and 8 bytes), so
either end may be a plain Connection. A batch's first message is its head: the buffer
count (with the packed and in-ring marks), the slot its slab buffers are in, the ring
fields of a pickle in the ring of small messages, each buffer's size (with its carrier's
flag), then the pickle.
"""

from __future__ import annotations

import os
import struct
from multiprocessing.connection import Connection
from typing import Any

from astream._dataset.transport.slabs import RingSlot

__all__ = ["READ_CHUNK_BYTES", "PipeReader", "TransportError", "frame", "prefix"]

_COUNT = struct.Struct("<I")
# Set in the head's count: the message's small arrays travel packed (see codec.packed).
_PACKED = 1 << 31
# Set in the head's count: the pickle is in the worker's ring of small messages (slabs.py).
_IN_RING = 1 << 30
_FLAGS_IN_COUNT = _PACKED | _IN_RING
# Where in the ring (offset, size), the ring's written count after it, and its file's
# size when the file comes along (the ring's first message; else 0).
_RING = struct.Struct("<QQQQ")
# The slot a message's slab buffers are in (-1: none), and its size when its file comes along.
_SLOT = struct.Struct("<iQ")
_SIZE = struct.Struct("<Q")
# Set in a buffer's size: the buffer travels as a descriptor, not through the pipe.
_VIA_FD = 1 << 63
# Set in a buffer's size: the buffer is in the message's slot.
_VIA_SLAB = 1 << 62
_FLAGS = _VIA_FD | _VIA_SLAB
# Bytes a PipeReader reads at once at most (the pipe holds 1 MiB, see spawn.py).
READ_CHUNK_BYTES = 1 << 20
_LENGTH = struct.Struct("!i")
_LONG_LENGTH = struct.Struct("!Q")


class TransportError(Exception):
    """A message could not be received whole (e.g. its descriptors were refused)."""


def prefix(raws: list[memoryview], via_fd: set[int], slot: RingSlot | None = None,
            in_slot: set[int] | None = None, packed: bool = False,
            ring: tuple[int, int, int, int] | None = None) -> bytes:
    """The message's head without its pickle (which a :class:`PipeWriter` writes after
    it, in the same frame, without joining the two: a copy of a small batch saved)."""
    in_slot = in_slot or set()

    def flags(i: int) -> int:
        return (_VIA_FD if i in via_fd else 0) | (_VIA_SLAB if i in in_slot else 0)

    sizes = b"".join(_SIZE.pack(r.nbytes | flags(i)) for i, r in enumerate(raws))
    where = _SLOT.pack(-1, 0) if slot is None else _SLOT.pack(slot.slot, slot.size if slot.new_fd is not None else 0)
    marks = (_PACKED if packed else 0) | (_IN_RING if ring is not None else 0)
    return _COUNT.pack(len(raws) | marks) + where + (_RING.pack(*ring) if ring is not None else b"") + sizes



def frame(message: bytes | memoryview, frames: list[bytes | memoryview], *more: bytes) -> None:
    """Frame ``message`` (followed by ``more``: one message of them all) as a Connection does."""
    n = memoryview(message).nbytes + sum(len(part) for part in more)
    frames.append(_LENGTH.pack(n) if n <= 0x7FFFFFFF else _LENGTH.pack(-1) + _LONG_LENGTH.pack(n))
    frames.append(message)
    frames.extend(more)



class PipeReader:
    """Reads the messages of a :class:`~multiprocessing.connection.Connection`'s pipe in
    large chunks: one ``read`` brings every message the pipe holds.

    A Connection reads each message with two ``read`` calls (its length, then its
    body), each releasing and retaking the GIL; a small batch is one ~30 KB message, so
    a reader thread that keeps up made two system calls and two GIL hand-offs per batch,
    on the consumer's critical path. Here a message already in the buffer costs none.
    The wire format is the Connection's: :func:`recv_object`'s senders are unchanged.

    Meant for the one thread that reads ``conn``; nothing else may read it meanwhile.
    """

    def __init__(self, conn: Connection, chunk: int = READ_CHUNK_BYTES) -> None:
        self._fd = conn.fileno()
        self._buf = bytearray(chunk)
        self._view = memoryview(self._buf)
        self._start = 0  # the buffered bytes not handed out yet: _buf[_start:_end]
        self._end = 0

    def _read(self) -> None:
        """Read what the pipe holds (at least one byte; blocks until there is one) into the buffer."""
        if self._end == len(self._buf):  # full: move what is left to the front
            self._compact()
        n = os.readv(self._fd, [self._view[self._end :]])
        if n == 0:
            raise EOFError("the producer closed the pipe")
        self._end += n

    def _compact(self) -> None:
        """Move the buffered bytes not handed out yet to the front of the buffer."""
        left = bytes(self._view[self._start : self._end])
        self._buf[: len(left)] = left
        self._start, self._end = 0, len(left)

    def _take(self, n: int) -> memoryview:
        """The next ``n`` buffered bytes (``n`` <= the chunk), reading until they are there."""
        if self._start + n > len(self._buf):  # would not fit behind the buffered part
            self._compact()
        while self._end - self._start < n:
            self._read()
        out = self._view[self._start : self._start + n]
        self._start += n
        if self._start == self._end:
            self._start = self._end = 0
        return out

    def _length(self) -> int:
        (n,) = _LENGTH.unpack(self._take(_LENGTH.size))
        if n == -1:
            (n,) = _LONG_LENGTH.unpack(self._take(_LONG_LENGTH.size))
        return int(n)

    def _fill(self, out: memoryview) -> None:
        """Fill ``out`` with the next bytes: what is buffered first, the rest read straight into it."""
        have = min(self._end - self._start, out.nbytes)
        out[:have] = self._view[self._start : self._start + have]
        self._start += have
        if self._start == self._end:
            self._start = self._end = 0
        done = have
        while done < out.nbytes:
            n = os.readv(self._fd, [out[done:]])
            if n == 0:
                raise EOFError("the producer closed the pipe")
            done += n

    def recv_bytes(self) -> bytes | memoryview:
        """The next message: a view of the buffer (valid until the next read) if it fits, else bytes."""
        n = self._length()
        if n <= len(self._buf) // 2:
            return self._take(n)
        out = bytearray(n)
        self._fill(memoryview(out))
        return bytes(out)

    def recv_bytes_into(self, buf: Any) -> int:
        """The next message, into ``buf`` (exactly its size, as :func:`recv_rest` sizes it)."""
        n = self._length()
        out = memoryview(buf).cast("B")
        if n != out.nbytes:
            raise TransportError(f"a batch's buffer of {out.nbytes} bytes came as a message of {n}")
        self._fill(out)
        return n

    def buffered(self) -> bool:
        """Whether a whole message is in the buffer already (the next :meth:`recv_bytes` won't wait)."""
        have = self._end - self._start
        if have < _LENGTH.size:
            return False
        (n,) = _LENGTH.unpack_from(self._view, self._start)
        return bool(0 <= n <= have - _LENGTH.size)

