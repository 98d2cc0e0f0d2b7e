"""A batch as one pickle and its out-of-band buffers: what :mod:`astream._dataset.transport.pipe` sends.

Protocol 5, the array buffers out of band except small ones (under :data:`INBAND_MAX_BYTES`:
ids, labels), which stay in the pickle; a message's small arrays travel packed
(:func:`packed`), not through numpy's reduce; large strided columns are made contiguous
first (:class:`_Pickler`). No I/O here: which carrier takes each buffer is the pipe's choice.
"""

from __future__ import annotations

import io
import pickle
from typing import Any

import numpy as np

from astream._dataset.transport.slabs import SLAB_MIN_BYTES

__all__ = ["INBAND_MAX_BYTES", "packed", "pickled", "plain", "unpacked"]

# Buffers smaller than this travel inside the pickle (in band), not as messages of their own.
INBAND_MAX_BYTES = 16 * 1024


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


def plain(obj: Any) -> bool:
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
    """A small C-contiguous array of a plain dtype, which :func:`packed` may carry."""
    if type(value) is not np.ndarray or value.nbytes >= INBAND_MAX_BYTES or not value.flags.c_contiguous:
        return False
    dtype = value.dtype
    return dtype.kind in _PACKABLE_KINDS and dtype.metadata is None


def packed(obj: Any) -> tuple[Any, bool]:
    """A message ``(kind, dict)`` with its small arrays (ids, labels) taken out of the dict
    as ``(key, dtype, shape, bytes, writable)``, and whether any was: ``(kind, dict, packs)``.

    numpy pickles an array through its reduce, which names ``numpy._core.numeric._frombuffer``
    and the dtype's class and state: for a batch's 32 ids that cost ~7 µs to pickle and
    ~4 µs to unpickle, as much as its 64 ``str``/``bytes`` values together, on each side
    of every small batch. Packed, they are a tuple of plain values (:func:`unpacked`
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


def unpacked(obj: Any) -> Any:
    """The message :func:`packed` took apart: its arrays rebuilt in their places, each
    as sent (value, dtype, shape, C order, writable or not), owning its memory."""
    kind, batch, packs = obj
    for key, dtype, shape, raw, writable in packs:
        batch[key] = np.frombuffer(bytearray(raw) if writable else raw, dtype).reshape(shape)
    return kind, batch


def pickled(obj: Any) -> tuple[bytes, list[memoryview]]:
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

    if plain(obj):
        return pickle.dumps(obj, protocol=5, buffer_callback=out_of_band), [buf.raw() for buf in buffers]
    out = io.BytesIO()
    _Pickler(out, protocol=5, buffer_callback=out_of_band).dump(obj)
    return out.getvalue(), [buf.raw() for buf in buffers]

