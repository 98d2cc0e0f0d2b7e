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
(:func:`~astream._dataset.transport.codec.packed`), not through numpy's reduce, whichever way the pickle goes.

A worker sends from its event loop through :class:`PipeWriter` (non-blocking, with the
loop's flow control), in the framing of :class:`multiprocessing.connection.Connection`,
so the consumer reads with :func:`recv_object` as before: no thread hand-off per batch
on the worker's side, where one costs up to the interpreter's switch interval (5 ms)
while the loop is busy decoding the next batch.

This module chooses the carrier of each buffer and puts the message together; the pickle
is :mod:`~astream._dataset.transport.codec`'s, the framing and the consumer's
:class:`PipeReader` :mod:`~astream._dataset.transport.wire`'s, the descriptors and the
producer's credits :mod:`~astream._dataset.transport.carriers`'.
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import pickle
import socket
import weakref
from multiprocessing.connection import Connection
from typing import Any, Protocol

from astream._dataset.transport import codec
from astream._dataset.transport.carriers import (
    ACK,
    FD_IN_FLIGHT,
    FD_MIN_BYTES,
    Credits,
    fd_passing_supported,
    map_buffer,
    recv_fds,
    send_fds,
    wants_fds,
)
from astream._dataset.transport.codec import INBAND_MAX_BYTES
from astream._dataset.transport.mapping import MappingError
from astream._dataset.transport.slabs import (
    SLAB_MIN_BYTES,
    MessageRing,
    RingSlot,
    SlabRing,
    SlabViews,
    layout,
)
from astream._dataset.transport.wire import (
    _COUNT,
    _FLAGS,
    _FLAGS_IN_COUNT,
    _IN_RING,
    _PACKED,
    _RING,
    _SIZE,
    _SLOT,
    _VIA_FD,
    _VIA_SLAB,
    READ_CHUNK_BYTES,
    PipeReader,
    TransportError,
    frame,
    prefix,
)

__all__ = [
    "FD_IN_FLIGHT", "FD_MIN_BYTES", "INBAND_MAX_BYTES", "READ_CHUNK_BYTES", "PipeReader", "PipeWriter",
    "TransportError", "fd_passing_supported", "recv_object", "recv_rest", "send_object",
]


def _head(payload: bytes, raws: list[memoryview], via_fd: set[int], slot: RingSlot | None = None,
          in_slot: set[int] | None = None, packed: bool = False) -> bytes:
    """The message's head (buffer count, slot, sizes) followed by ``payload``."""
    return prefix(raws, via_fd, slot, in_slot, packed) + payload


_SYNC_CREDITS: weakref.WeakKeyDictionary[socket.socket, Credits] = weakref.WeakKeyDictionary()


def send_object(conn: Connection, obj: Any, channel: socket.socket | None = None) -> None:
    """Send ``obj`` (a batch, an error report...) over ``conn`` (blocking).

    With ``channel`` (the producer's end of a Unix socket pair beside ``conn``), large
    buffers travel as anonymous files over it. Meant for one sender per ``channel``.
    """
    wire, packed = codec.packed(obj)
    payload, raws = codec.pickled(wire)
    via_fd: set[int] = set()
    if channel is not None and wants_fds(channel, raws) and fd_passing_supported():
        credits = _SYNC_CREDITS.get(channel)
        if credits is None:
            credits = _SYNC_CREDITS[channel] = Credits(channel)
        credits.drain()
        while credits.unacked >= FD_IN_FLIGHT:
            credits.take_acks(channel.recv(4096))
        via_fd = credits.send(raws)
    conn.send_bytes(_head(payload, raws, via_fd, packed=packed))
    for i, raw in enumerate(raws):
        if i not in via_fd:
            conn.send_bytes(raw)


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
        self._credits: Credits | None = None
        self._messages: MessageRing | None = None
        if channel is not None and fd_passing_supported():
            channel.setblocking(False)
            self._credits = Credits(channel, SlabRing())
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

    async def _credit(self, credits: Credits) -> None:
        """Wait until another message with descriptors may go."""
        credits.drain()
        loop = asyncio.get_running_loop()
        while credits.unacked >= FD_IN_FLIGHT:
            credits.take_acks(await loop.sock_recv(credits.channel, 4096))
            self._check()

    async def send(self, obj: Any) -> None:
        """Queue ``obj`` on the pipe; wait while more than the loop's high-water mark is queued."""
        self._check()
        wire, packed = codec.packed(obj)
        payload, raws = codec.pickled(wire)
        via_fd: set[int] = set()
        slot: RingSlot | None = None
        in_slot: set[int] = set()
        credits = self._credits
        if credits is not None and wants_fds(credits.channel, raws, SLAB_MIN_BYTES):
            await self._credit(credits)
            self._check()
            # From here to the pipe, nothing awaits: the descriptors and the head that
            # announces them go out in the same order, whoever else sends.
            slot, in_slot = credits.place(raws)
            via_fd = credits.send(raws, slot, frozenset(in_slot))
        frames: list[bytes | memoryview] = []
        if not raws and (ring := self._in_ring(payload)) is not None:
            frame(prefix(raws, via_fd, packed=packed, ring=ring), frames)  # the pickle is in the ring
        else:
            frame(prefix(raws, via_fd, slot, in_slot, packed), frames, payload)
        for i, raw in enumerate(raws):
            if i not in via_fd and i not in in_slot:
                frame(raw, frames)
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
                send_fds(self._credits.channel, [new_fd])
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
        fds = recv_fds(channel, wanted)
    if wanted or slot >= 0:
        with contextlib.suppress(OSError):
            assert channel is not None
            channel.sendall(ACK)  # the producer may send the next one
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
                    buffers.append(map_buffer(fd, size & ~_FLAGS))
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
    return codec.unpacked(obj) if packed else obj


def _from_ring(head: bytes | memoryview, channel: socket.socket | None, slabs: SlabViews | None, packed: bool) -> Any:
    """The message whose pickle is in the worker's ring of small messages (its head read)."""
    at, size, end, announced = _RING.unpack_from(head, _COUNT.size + _SLOT.size)
    if slabs is None or channel is None:
        raise TransportError("a batch came in a worker's ring of small messages but there is none here")
    if announced:
        (fd,) = recv_fds(channel, 1)
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
    return codec.unpacked(obj) if packed else obj
