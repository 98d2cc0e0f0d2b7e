"""Moving batches between processes with one copy of the array data.

A batch (a dict of NumPy arrays and lists) is pickled with protocol 5 and its array
buffers are taken out of band, then sent over a pipe as separate messages: the
arrays' bytes go from the producer's memory into the pipe and from the pipe into a
fresh writable buffer of the consumer, with no pickled copy in between.

A worker sends from its event loop through :class:`PipeWriter` (non-blocking, with the
loop's flow control), in the framing of :class:`multiprocessing.connection.Connection`,
so the consumer reads with :func:`recv_object` as before: no thread hand-off per batch
on the worker's side, where one costs up to the interpreter's switch interval (5 ms)
while the loop is busy decoding the next batch.
"""

from __future__ import annotations

import asyncio
import os
import pickle
import struct
from multiprocessing.connection import Connection
from typing import Any

__all__ = ["PipeWriter", "recv_object", "send_object"]

_COUNT = struct.Struct("<I")
_SIZE = struct.Struct("<Q")


def _messages(obj: Any) -> list[bytes | memoryview]:
    """The messages that carry ``obj``: the pickle with the buffer sizes, then each buffer."""
    buffers: list[pickle.PickleBuffer] = []
    payload = pickle.dumps(obj, protocol=5, buffer_callback=buffers.append)
    raws = [buf.raw() for buf in buffers]
    sizes = b"".join(_SIZE.pack(r.nbytes) for r in raws)
    return [_COUNT.pack(len(raws)) + sizes + payload, *raws]


def send_object(conn: Connection, obj: Any) -> None:
    """Send ``obj`` (a batch, an error report...) over ``conn``."""
    for message in _messages(obj):
        conn.send_bytes(message)


_LENGTH = struct.Struct("!i")
_LONG_LENGTH = struct.Struct("!Q")


class PipeWriter(asyncio.Protocol):
    """Send objects over a pipe from an event loop, for :func:`recv_object` to read.

    Use :meth:`open` on the writing end of a ``Pipe(duplex=False)``; the connection must
    not be used directly afterwards (its descriptor is non-blocking then).
    """

    def __init__(self) -> None:
        self._transport: Any = None  # uvloop's transports are no asyncio.WriteTransport
        self._paused = False
        self._waiters: list[asyncio.Future[None]] = []
        self._lost: BaseException | None = None
        self._closed: asyncio.Future[None] | None = None

    @classmethod
    async def open(cls, conn: Connection) -> PipeWriter:
        loop = asyncio.get_running_loop()
        pipe = os.fdopen(os.dup(conn.fileno()), "wb", buffering=0)
        _, protocol = await loop.connect_write_pipe(cls, pipe)
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

    async def send(self, obj: Any) -> None:
        """Queue ``obj`` on the pipe; wait while more than the loop's high-water mark is queued."""
        if self._lost is not None or self._transport is None:
            raise BrokenPipeError("the consumer closed the pipe")
        frames: list[bytes | memoryview] = []
        for message in _messages(obj):
            n = memoryview(message).nbytes
            frames.append(_LENGTH.pack(n) if n <= 0x7FFFFFFF else _LENGTH.pack(-1) + _LONG_LENGTH.pack(n))
            frames.append(message)
        self._transport.writelines(frames)
        while self._paused and self._lost is None:
            fut = asyncio.get_running_loop().create_future()
            self._waiters.append(fut)
            await fut
        if self._lost is not None:
            raise BrokenPipeError("the consumer closed the pipe")

    async def aclose(self) -> None:
        """Flush what is queued and close."""
        if self._transport is None:
            return
        self._transport.close()  # after the buffer is written
        if self._closed is not None:
            await self._closed


def recv_object(conn: Connection) -> Any:
    """Receive one object sent by :func:`send_object` (blocking)."""
    head = conn.recv_bytes()
    (count,) = _COUNT.unpack_from(head)
    sizes = [_SIZE.unpack_from(head, _COUNT.size + i * _SIZE.size)[0] for i in range(count)]
    buffers = []
    for size in sizes:
        # Received straight into a writable buffer: the arrays rebuilt over it are writable
        # and the data is copied once (pipe -> buffer).
        buf = bytearray(size)
        if size:
            conn.recv_bytes_into(buf)
        else:
            conn.recv_bytes()
        buffers.append(buf)
    return pickle.loads(memoryview(head)[_COUNT.size + count * _SIZE.size :], buffers=buffers)
