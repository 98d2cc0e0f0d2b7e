"""Moving batches between processes with one copy of the array data.

A batch (a dict of NumPy arrays and lists) is pickled with protocol 5 and its array
buffers are taken out of band, then sent over a pipe as separate messages: the
arrays' bytes go from the producer's memory into the pipe and from the pipe into a
fresh writable buffer of the consumer, with no pickled copy in between.
"""

from __future__ import annotations

import pickle
import struct
from multiprocessing.connection import Connection
from typing import Any

__all__ = ["recv_object", "send_object"]

_COUNT = struct.Struct("<I")
_SIZE = struct.Struct("<Q")


def send_object(conn: Connection, obj: Any) -> None:
    """Send ``obj`` (a batch, an error report...) over ``conn``."""
    buffers: list[pickle.PickleBuffer] = []
    payload = pickle.dumps(obj, protocol=5, buffer_callback=buffers.append)
    raws = [buf.raw() for buf in buffers]
    sizes = b"".join(_SIZE.pack(r.nbytes) for r in raws)
    conn.send_bytes(_COUNT.pack(len(raws)) + sizes + payload)
    for raw in raws:
        conn.send_bytes(raw)


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
