"""Moving batches between processes with at most one copy of the array data.

A batch (a dict of NumPy arrays and lists) is pickled with protocol 5 and its array
buffers are taken out of band, except small ones (under :data:`INBAND_MAX_BYTES`: ids,
labels), which stay in the pickle: a batch of small records is one message. Mid-sized
buffers go over a pipe as separate messages: the arrays' bytes go from the producer's
memory into the pipe and from the pipe into a fresh writable buffer of the consumer,
with no pickled copy in between. The consumer's reader thread reads its pipe through a
:class:`PipeReader`, which brings every message the pipe holds in one ``read``.

Large buffers (:data:`FD_MIN_BYTES` and more, on Linux) skip the pipe: the producer
writes each into an anonymous file (``memfd_create``: no name anywhere, nothing that
outlives the processes holding it, even after a SIGKILL) and passes its descriptor
over a Unix socket (``SCM_RIGHTS``) beside the pipe; the consumer maps the file and
rebuilds the array over the mapping (writable, ``MAP_SHARED``: the file is the
consumer's alone once received), then closes the descriptor. The data is copied once,
by the producer, instead of into and out of the pipe. The consumer acknowledges each
message that carried descriptors, and a producer keeps at most :data:`FD_IN_FLIGHT`
of those unacknowledged: the pipe's back-pressure, which such messages barely load,
is kept that way. Where ``memfd_create`` or descriptor passing is missing, or a file
cannot be made, buffers go through the pipe as before.

A :class:`PipeWriter` with a channel first tries its ring of shared-memory slots
(:mod:`astream._dataset.transport.slabs`): buffers of :data:`~astream._dataset.transport.slabs.SLAB_MIN_BYTES`
and more are copied into a slot mapped once on both sides, and the message names the
slot (its descriptor travels only the first time); the consumer rebuilds the arrays
over its mapping, without a copy, and the slot goes back to the worker when the batch's
last array is gone. That message is acknowledged like one with descriptors (the same
back-pressure); files per buffer are what a worker falls back to when every slot is held.

A small batch (a pickle of 4 KiB or more and no out-of-band buffer: the ``str``/``bytes``
lists and ids of small records) goes into the worker's ring of pickles instead
(:class:`~astream._dataset.transport.slabs.MessageRing`), and only its head through the pipe; the
consumer unpickles it from the ring in place. Its small arrays travel packed
(:func:`_packed`), not through numpy's reduce, whichever way the pickle goes.

A worker sends from its event loop through :class:`PipeWriter` (non-blocking, with the
loop's flow control), in the framing of :class:`multiprocessing.connection.Connection`,
so the consumer reads with :func:`recv_object` as before: no thread hand-off per batch
on the worker's side, where one costs up to the interpreter's switch interval (5 ms)
while the loop is busy decoding the next batch.
"""

from __future__ import annotations

import array
import asyncio
import contextlib
import io
import os
import pickle
import socket
import struct
import weakref
from multiprocessing.connection import Connection
from typing import Any, Protocol

import numpy as np

from astream._dataset.transport.mapping import MappingError, map_file, mapping_supported
from astream._dataset.transport.slabs import (
    SLAB_MIN_BYTES,
    MessageRing,
    RingSlot,
    SlabRing,
    SlabViews,
    is_release,
    layout,
)

__all__ = [
    "FD_IN_FLIGHT", "FD_MIN_BYTES", "INBAND_MAX_BYTES", "READ_CHUNK_BYTES", "PipeReader", "PipeWriter",
    "TransportError", "fd_passing_supported", "recv_object", "recv_rest", "send_object",
]

_COUNT = struct.Struct("<I")
# Set in the head's count: the message's small arrays travel packed (see _packed).
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

# Buffers this large or larger travel as anonymous files.
FD_MIN_BYTES = 256 * 1024
# Bytes a PipeReader reads at once at most (the pipe holds 1 MiB, see spawn.py).
READ_CHUNK_BYTES = 1 << 20
# Buffers smaller than this travel inside the pickle (in band), not as messages of their own.
INBAND_MAX_BYTES = 16 * 1024
# Messages with descriptors a producer may have sent and the consumer not yet received.
FD_IN_FLIGHT = 2
_FDS_PER_SEND = 250  # the kernel takes at most 253 descriptors per message (SCM_MAX_FD)
_ACK = b"\x01"


class TransportError(Exception):
    """A message could not be received whole (e.g. its descriptors were refused)."""


def fd_passing_supported() -> bool:
    """Whether large buffers can travel as anonymous files here."""
    return (
        mapping_supported()
        and hasattr(os, "memfd_create")
        and hasattr(socket, "CMSG_SPACE")
        and hasattr(socket, "SCM_RIGHTS")
        and hasattr(socket, "AF_UNIX")
    )


class _Pickler(pickle.Pickler):
    """Protocol 5, with large non-contiguous arrays made contiguous first.

    A column of a batch of fixed-size records is a strided view of the rows it was
    decoded from; pickled as it is, numpy copies it into the pickle itself (in band),
    and it crosses the pipe twice more. Made contiguous (one copy), it travels out of
    band: into a slot, no pipe.
    """

    def reducer_override(self, obj: Any) -> Any:
        if _strided(obj):
            return np.ascontiguousarray(obj).__reduce_ex__(5)
        return NotImplemented


def _strided(obj: Any) -> bool:
    """A large non-contiguous array, which :class:`_Pickler` makes contiguous."""
    return (type(obj) is np.ndarray and obj.nbytes >= SLAB_MIN_BYTES and not obj.dtype.hasobject
            and not (obj.flags.c_contiguous or obj.flags.f_contiguous))


def _plain(obj: Any) -> bool:
    """Whether ``obj`` pickles the same without :class:`_Pickler`: a message ``(kind, dict)``
    (or its packed form, ``(kind, dict, packs)``) none of whose values is a large strided
    array (where a batch's columns are).

    :class:`_Pickler` calls its Python ``reducer_override`` for every object pickled: for
    a batch of 64 small ``str``/``bytes`` values that cost ~30 % of pickling it. Arrays
    nested deeper (in lists) are not looked for: they pickle in band, as before the override.
    """
    if type(obj) is not tuple or len(obj) not in (2, 3) or type(obj[1]) is not dict:
        return False
    return not any(_strided(value) for value in obj[1].values())


# Dtype kinds a small array may travel packed as: numbers, booleans, dates and durations
# (what ``dtype.str`` names exactly: no fields, no object references, no strings).
_PACKABLE_KINDS = frozenset("biufcmM")


def _packable(value: Any) -> bool:
    """A small C-contiguous array of a plain dtype, which :func:`_packed` may carry."""
    if type(value) is not np.ndarray or value.nbytes >= INBAND_MAX_BYTES or not value.flags.c_contiguous:
        return False
    dtype = value.dtype
    return dtype.kind in _PACKABLE_KINDS and dtype.metadata is None


def _packed(obj: Any) -> tuple[Any, bool]:
    """A message ``(kind, dict)`` with its small arrays (ids, labels) taken out of the dict
    as ``(key, dtype, shape, bytes, writable)``, and whether any was: ``(kind, dict, packs)``.

    numpy pickles an array through its reduce, which names ``numpy._core.numeric._frombuffer``
    and the dtype's class and state: for a batch's 32 ids that cost ~7 µs to pickle and
    ~4 µs to unpickle, as much as its 64 ``str``/``bytes`` values together, on each side
    of every small batch. Packed, they are a tuple of plain values (:func:`_unpacked`
    rebuilds the same arrays). The dict keeps its keys in order (``None`` holds a packed
    array's place).
    """
    if type(obj) is not tuple or len(obj) != 2 or type(obj[1]) is not dict:
        return obj, False
    kind, batch = obj
    small = [(key, value) for key, value in batch.items() if _packable(value)]
    if not small or len({id(value) for _, value in small}) < len(small):
        return obj, False  # (one array under two keys arrives as one object, as pickled)
    packs = [(key, value.dtype.str, value.shape, value.tobytes(), bool(value.flags.writeable))
             for key, value in small]
    batch = dict(batch)
    for pack in packs:
        batch[pack[0]] = None
    return (kind, batch, packs), True


def _unpacked(obj: Any) -> Any:
    """The message :func:`_packed` took apart: its arrays rebuilt in their places, each
    as sent (value, dtype, shape, C order, writable or not), owning its memory."""
    kind, batch, packs = obj
    for key, dtype, shape, raw, writable in packs:
        batch[key] = np.frombuffer(bytearray(raw) if writable else raw, dtype).reshape(shape)
    return kind, batch


def _pickled(obj: Any) -> tuple[bytes, list[memoryview]]:
    buffers: list[pickle.PickleBuffer] = []

    def out_of_band(buf: pickle.PickleBuffer) -> bool:
        # False: out of band. Small buffers (ids, labels) go in the pickle instead: a
        # copy of a few hundred bytes costs less than the pipe message of their own they
        # would need (two reads and a buffer on the consumer's side, on its critical path).
        # (Read-only ones arrive read-only either way: pickle keeps the flag.)
        if buf.raw().nbytes < INBAND_MAX_BYTES:
            return True
        buffers.append(buf)
        return False

    if _plain(obj):
        return pickle.dumps(obj, protocol=5, buffer_callback=out_of_band), [buf.raw() for buf in buffers]
    out = io.BytesIO()
    _Pickler(out, protocol=5, buffer_callback=out_of_band).dump(obj)
    return out.getvalue(), [buf.raw() for buf in buffers]


def _head(payload: bytes, raws: list[memoryview], via_fd: set[int], slot: RingSlot | None = None,
          in_slot: set[int] | None = None, packed: bool = False) -> bytes:
    """The message's head (buffer count, slot, sizes) followed by ``payload``."""
    return _prefix(raws, via_fd, slot, in_slot, packed) + payload


def _prefix(raws: list[memoryview], via_fd: set[int], slot: RingSlot | None = None,
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


def _memfd(raw: memoryview) -> int | None:
    """An anonymous file holding ``raw``'s bytes, or None where one cannot be made."""
    try:
        fd = os.memfd_create("astream-batch", os.MFD_CLOEXEC)
    except (OSError, AttributeError):
        return None
    try:
        done, n = 0, raw.nbytes
        while done < n:
            done += os.write(fd, raw[done:])
    except OSError:
        os.close(fd)
        return None
    return fd


def _send_fds(channel: socket.socket, fds: list[int]) -> None:
    for i in range(0, len(fds), _FDS_PER_SEND):
        ancdata = [(socket.SOL_SOCKET, socket.SCM_RIGHTS, array.array("i", fds[i : i + _FDS_PER_SEND]))]
        try:
            channel.sendmsg([_ACK], ancdata)
        except BlockingIOError:  # not with the credits (a few bytes queued at most); wait if so
            blocking = channel.getblocking()
            channel.setblocking(True)
            try:
                channel.sendmsg([_ACK], ancdata)
            finally:
                channel.setblocking(blocking)


class _Credits:
    """The producer's count of messages with descriptors or slots the consumer has not
    acknowledged, and (with a ring) the slots it gave back."""

    def __init__(self, channel: socket.socket, ring: SlabRing | None = None) -> None:
        self.channel = channel
        self.unacked = 0
        self.ring = ring

    def take_acks(self, data: bytes) -> None:
        if not data:
            raise BrokenPipeError("the consumer closed the descriptor channel")
        acks = 0
        for byte in data:
            if is_release(byte):
                if self.ring is not None:
                    self.ring.release(byte & 0x7F)
            else:
                acks += 1
        self.unacked = max(0, self.unacked - acks)

    def drain(self) -> None:
        """Count the acknowledgements (and releases) already there, without waiting."""
        while self.unacked or (self.ring is not None and self.ring.busy):
            try:
                data = self.channel.recv(4096, socket.MSG_DONTWAIT)
            except (BlockingIOError, InterruptedError):
                return
            self.take_acks(data)

    def place(self, raws: list[memoryview]) -> tuple[RingSlot | None, set[int]]:
        """Copy the slab-sized buffers of ``raws`` into a free slot of the ring, if there is one."""
        if self.ring is None:
            return None, set()
        # Small buffers (labels, ids) stay out: a user who keeps them (metrics over an
        # epoch) would otherwise hold the slot of the large ones beside them.
        wanted = [i for i, r in enumerate(raws) if r.nbytes >= SLAB_MIN_BYTES]
        if not wanted:
            return None, set()
        offsets, need = layout([raws[i].nbytes for i in wanted])
        slot = self.ring.take(need)
        if slot is None:
            return None, set()
        for i, at in zip(wanted, offsets, strict=True):
            slot.memory[at : at + raws[i].nbytes] = raws[i]  # the one copy
        return slot, set(wanted)

    def send(self, raws: list[memoryview], slot: RingSlot | None = None, in_slot: frozenset[int] = frozenset()) -> set[int]:
        """Send the slot's file if new, and the large buffers of ``raws`` not in it as files
        (credit taken if anything but the pipe carries the message); the indices sent as files."""
        fds: dict[int, int] = {}
        first = [slot.new_fd] if slot is not None and slot.new_fd is not None else []
        try:
            for i, raw in enumerate(raws):
                if raw.nbytes >= FD_MIN_BYTES and i not in in_slot:
                    fd = _memfd(raw)
                    if fd is None:
                        break  # no files here (now): the rest go through the pipe
                    fds[i] = fd
            if fds or first:
                _send_fds(self.channel, first + list(fds.values()))
            if fds or slot is not None:
                self.unacked += 1
        finally:
            for fd in [*first, *fds.values()]:
                os.close(fd)  # the consumer has its own now (or the message failed)
        return set(fds)


def _wants_fds(channel: socket.socket | None, raws: list[memoryview], least: int = FD_MIN_BYTES) -> bool:
    return channel is not None and any(r.nbytes >= least for r in raws)


_SYNC_CREDITS: weakref.WeakKeyDictionary[socket.socket, _Credits] = weakref.WeakKeyDictionary()


def send_object(conn: Connection, obj: Any, channel: socket.socket | None = None) -> None:
    """Send ``obj`` (a batch, an error report...) over ``conn`` (blocking).

    With ``channel`` (the producer's end of a Unix socket pair beside ``conn``), large
    buffers travel as anonymous files over it. Meant for one sender per ``channel``.
    """
    wire, packed = _packed(obj)
    payload, raws = _pickled(wire)
    via_fd: set[int] = set()
    if channel is not None and _wants_fds(channel, raws) and fd_passing_supported():
        credits = _SYNC_CREDITS.get(channel)
        if credits is None:
            credits = _SYNC_CREDITS[channel] = _Credits(channel)
        credits.drain()
        while credits.unacked >= FD_IN_FLIGHT:
            credits.take_acks(channel.recv(4096))
        via_fd = credits.send(raws)
    conn.send_bytes(_head(payload, raws, via_fd, packed=packed))
    for i, raw in enumerate(raws):
        if i not in via_fd:
            conn.send_bytes(raw)


_LENGTH = struct.Struct("!i")
_LONG_LENGTH = struct.Struct("!Q")


def _frame(message: bytes | memoryview, frames: list[bytes | memoryview], *more: bytes) -> None:
    """Frame ``message`` (followed by ``more``: one message of them all) as a Connection does."""
    n = memoryview(message).nbytes + sum(len(part) for part in more)
    frames.append(_LENGTH.pack(n) if n <= 0x7FFFFFFF else _LENGTH.pack(-1) + _LONG_LENGTH.pack(n))
    frames.append(message)
    frames.extend(more)


class PipeWriter(asyncio.Protocol):
    """Send objects over a pipe from an event loop, for :func:`recv_object` to read.

    Use :meth:`open` on the writing end of a ``Pipe(duplex=False)``; the connection must
    not be used directly afterwards (its descriptor is non-blocking then). With
    ``channel`` (the producer's end of a Unix socket pair), large buffers travel as
    anonymous files over it; the socket is made non-blocking.
    """

    def __init__(self, channel: socket.socket | None = None) -> None:
        self._transport: Any = None  # uvloop's transports are no asyncio.WriteTransport
        self._paused = False
        self._waiters: list[asyncio.Future[None]] = []
        self._lost: BaseException | None = None
        self._closed: asyncio.Future[None] | None = None
        self._credits: _Credits | None = None
        self._messages: MessageRing | None = None
        if channel is not None and fd_passing_supported():
            channel.setblocking(False)
            self._credits = _Credits(channel, SlabRing())
            self._messages = MessageRing()

    @classmethod
    async def open(cls, conn: Connection, channel: socket.socket | None = None) -> PipeWriter:
        loop = asyncio.get_running_loop()
        pipe = os.fdopen(os.dup(conn.fileno()), "wb", buffering=0)
        _, protocol = await loop.connect_write_pipe(lambda: cls(channel), pipe)
        return protocol

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self._transport = transport
        self._closed = asyncio.get_running_loop().create_future()

    def pause_writing(self) -> None:
        self._paused = True

    def resume_writing(self) -> None:
        self._paused = False
        self._wake()

    def connection_lost(self, exc: Exception | None) -> None:
        self._lost = exc if exc is not None else BrokenPipeError("the consumer closed the pipe")
        self._paused = False
        self._wake()
        if self._closed is not None and not self._closed.done():
            self._closed.set_result(None)

    def _wake(self) -> None:
        waiters, self._waiters = self._waiters, []
        for fut in waiters:
            if not fut.done():
                fut.set_result(None)

    def _check(self) -> None:
        if self._lost is not None or self._transport is None:
            raise BrokenPipeError("the consumer closed the pipe")

    async def _credit(self, credits: _Credits) -> None:
        """Wait until another message with descriptors may go."""
        credits.drain()
        loop = asyncio.get_running_loop()
        while credits.unacked >= FD_IN_FLIGHT:
            credits.take_acks(await loop.sock_recv(credits.channel, 4096))
            self._check()

    async def send(self, obj: Any) -> None:
        """Queue ``obj`` on the pipe; wait while more than the loop's high-water mark is queued."""
        self._check()
        wire, packed = _packed(obj)
        payload, raws = _pickled(wire)
        via_fd: set[int] = set()
        slot: RingSlot | None = None
        in_slot: set[int] = set()
        credits = self._credits
        if credits is not None and _wants_fds(credits.channel, raws, SLAB_MIN_BYTES):
            await self._credit(credits)
            self._check()
            # From here to the pipe, nothing awaits: the descriptors and the head that
            # announces them go out in the same order, whoever else sends.
            slot, in_slot = credits.place(raws)
            via_fd = credits.send(raws, slot, frozenset(in_slot))
        frames: list[bytes | memoryview] = []
        if not raws and (ring := self._in_ring(payload)) is not None:
            _frame(_prefix(raws, via_fd, packed=packed, ring=ring), frames)  # the pickle is in the ring
        else:
            _frame(_prefix(raws, via_fd, slot, in_slot, packed), frames, payload)
        for i, raw in enumerate(raws):
            if i not in via_fd and i not in in_slot:
                _frame(raw, frames)
        self._transport.writelines(frames)
        while self._paused and self._lost is None:
            fut = asyncio.get_running_loop().create_future()
            self._waiters.append(fut)
            await fut
        if self._lost is not None:
            raise BrokenPipeError("the consumer closed the pipe")

    def _in_ring(self, payload: bytes) -> tuple[int, int, int, int] | None:
        """Put a small batch's pickle into the ring of small messages: the head's ring
        fields, or None (no ring, no room: the pipe). Sends the ring's file the first time."""
        messages = self._messages
        placed = messages.place(payload) if messages is not None else None
        if placed is None:
            return None
        assert messages is not None
        assert self._credits is not None
        at, end, new_fd = placed
        if new_fd is not None:
            try:
                _send_fds(self._credits.channel, [new_fd])
            except BaseException:
                messages.abandon()  # never announced: the pipe from now on
                raise
            finally:
                os.close(new_fd)
        return at, len(payload), end, messages.size if new_fd is not None else 0

    async def aclose(self) -> None:
        """Flush what is queued and close."""
        if self._transport is None:
            return
        self._transport.close()  # after the buffer is written
        if self._closed is not None:
            await self._closed


def _recv_fds(channel: socket.socket, count: int) -> list[int]:
    fds: list[int] = []
    try:
        while len(fds) < count:
            want = min(_FDS_PER_SEND, count - len(fds))
            flags = getattr(socket, "MSG_CMSG_CLOEXEC", 0)
            data, ancdata, msg_flags, _ = channel.recvmsg(1, socket.CMSG_SPACE(want * 4), flags)
            for level, kind, cdata in ancdata:
                if level == socket.SOL_SOCKET and kind == socket.SCM_RIGHTS:
                    got = array.array("i")
                    got.frombytes(cdata[: len(cdata) - len(cdata) % got.itemsize])
                    fds.extend(got)
            if not data and not ancdata:
                raise EOFError("the producer closed the descriptor channel")
            if msg_flags & getattr(socket, "MSG_CTRUNC", 0):
                raise TransportError("descriptors of a batch were refused (too many open files?)")
        if len(fds) != count:
            raise TransportError(f"expected {count} descriptors with a batch, got {len(fds)}")
    except BaseException:
        for fd in fds:
            os.close(fd)
        raise
    return fds


def _map(fd: int, size: int) -> memoryview:
    """A writable view of the first ``size`` bytes of file ``fd``, alive as long as it is."""
    try:
        pages = map_file(fd, size)
    except MappingError as exc:
        raise TransportError(f"could not map a batch's buffer of {size} bytes: {exc.strerror}") from exc
    return memoryview(pages).cast("B")[:size]


def recv_object(conn: Connection, channel: socket.socket | None = None, slabs: SlabViews | None = None) -> Any:
    """Receive one object sent by :func:`send_object` or :class:`PipeWriter` (blocking).

    ``channel`` is the consumer's end of the socket pair the producer sends files over;
    ``slabs`` the mappings of the producer's slots (one per producer, kept across messages).
    """
    return recv_rest(conn, conn.recv_bytes(), channel, slabs)


class _Source(Protocol):
    """Where :func:`recv_rest` reads a message's buffers: a Connection or a :class:`PipeReader`."""

    def recv_bytes(self) -> bytes | memoryview: ...

    def recv_bytes_into(self, buf: Any) -> int: ...


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


def recv_rest(conn: _Source, head: bytes | memoryview, channel: socket.socket | None = None,
              slabs: SlabViews | None = None) -> Any:
    """The rest of :func:`recv_object` once its first message, ``head``, was read from ``conn``
    (a Connection, or the :class:`PipeReader` of one)."""
    (count,) = _COUNT.unpack_from(head)
    packed, in_ring, count = bool(count & _PACKED), bool(count & _IN_RING), count & ~_FLAGS_IN_COUNT
    if in_ring:
        return _from_ring(head, channel, slabs, packed)
    if count and isinstance(head, memoryview):
        head = bytes(head)  # a view of a PipeReader's buffer: the reads of the buffers below reuse it
    slot, new_size = _SLOT.unpack_from(head, _COUNT.size)
    at = _COUNT.size + _SLOT.size
    sizes = [_SIZE.unpack_from(head, at + i * _SIZE.size)[0] for i in range(count)]
    wanted = sum(1 for size in sizes if size & _VIA_FD) + (1 if new_size else 0)
    fds: list[int] = []
    if slot >= 0 and (slabs is None or channel is None):
        raise TransportError("a batch came in a shared-memory slot but there are no slots here")
    if wanted:
        if channel is None:
            raise TransportError("a batch came with descriptors but there is no channel for them")
        fds = _recv_fds(channel, wanted)
    if wanted or slot >= 0:
        with contextlib.suppress(OSError):
            assert channel is not None
            channel.sendall(_ACK)  # the producer may send the next one
    buffers: list[Any] = []
    try:
        slab: memoryview | None = None
        if slot >= 0:
            assert slabs is not None
            if new_size:
                fd = fds.pop(0)
                try:
                    slabs.install(slot, fd, new_size)
                except MappingError as exc:
                    raise TransportError(f"could not map a worker's slot of {new_size} bytes: {exc.strerror}") from exc
                finally:
                    os.close(fd)
            elif not slabs.known(slot):
                raise TransportError(f"a batch came in slot {slot}, which was never announced")
            offsets, need = layout([size & ~_FLAGS for size in sizes if size & _VIA_SLAB])
            slab = slabs.lease(slot, need)
            places = iter(offsets)
        for size in sizes:
            if size & _VIA_SLAB:
                assert slab is not None
                start, n = next(places), size & ~_FLAGS
                buffers.append(slab[start : start + n])
                continue
            if size & _VIA_FD:
                fd = fds.pop(0)
                try:
                    buffers.append(_map(fd, size & ~_FLAGS))
                finally:
                    os.close(fd)
                continue
            # Received straight into a writable buffer: the arrays rebuilt over it are writable
            # and the data is copied once (pipe -> buffer).
            buf = bytearray(size)
            if size:
                conn.recv_bytes_into(buf)
            else:
                conn.recv_bytes()
            buffers.append(buf)
    finally:
        for fd in fds:
            os.close(fd)
    obj = pickle.loads(memoryview(head)[at + count * _SIZE.size :], buffers=buffers)
    return _unpacked(obj) if packed else obj


def _from_ring(head: bytes | memoryview, channel: socket.socket | None, slabs: SlabViews | None, packed: bool) -> Any:
    """The message whose pickle is in the worker's ring of small messages (its head read)."""
    at, size, end, announced = _RING.unpack_from(head, _COUNT.size + _SLOT.size)
    if slabs is None or channel is None:
        raise TransportError("a batch came in a worker's ring of small messages but there is none here")
    if announced:
        (fd,) = _recv_fds(channel, 1)
        try:
            slabs.install_messages(fd, announced)
        except MappingError as exc:
            raise TransportError(f"could not map a worker's ring of {announced} bytes: {exc.strerror}") from exc
        finally:
            os.close(fd)
    view = slabs.message(at, size)
    if view is None:
        raise TransportError(f"a batch came at {at}+{size} of a worker's ring of small messages, which does not hold it")
    try:
        obj = pickle.loads(view)  # every value copied out: the ring's bytes are free after it
    finally:
        view.release()
        slabs.message_read(end)
    return _unpacked(obj) if packed else obj
