"""Batches in a worker's shared-memory slots: reused once released, never while held."""

from __future__ import annotations

import asyncio
import ctypes
import gc
import multiprocessing as mp
import os
import socket
import threading
import time
from collections.abc import Iterator
from multiprocessing.connection import Connection
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from astream._dataset.transport.pipe import FD_IN_FLIGHT, PipeWriter, fd_passing_supported, recv_object
from astream._dataset.transport.slabs import (
    MAX_SLOTS,
    SLAB_MIN_BYTES,
    MessageRing,
    SlabRing,
    SlabViews,
    layout,
)

pytestmark = pytest.mark.skipif(not fd_passing_supported(), reason="no memfd_create / descriptor passing here")

ROWS = SLAB_MIN_BYTES // 4 + 7  # one column over the slab threshold


def _slabs_mapped() -> int:
    """Distinct slot files mapped in this process (the producer's and the consumer's maps)."""
    with open("/proc/self/maps") as f:
        return len({line.split()[4] for line in f if "astream-slab" in line})


def _batch(i: int) -> dict[str, Any]:
    return {"i": i, "x": np.full(ROWS, i, np.float32), "small": np.arange(5) + i}


@pytest.fixture
def link() -> Iterator[tuple[Connection, Connection, socket.socket, socket.socket]]:
    a, b = mp.Pipe(duplex=False)
    theirs, ours = socket.socketpair()
    try:
        yield a, b, theirs, ours
    finally:
        for end in (a, b, theirs, ours):
            end.close()


def _produce(b: Connection, theirs: socket.socket, count: int) -> threading.Thread:
    async def run() -> None:
        writer = await PipeWriter.open(b, theirs)
        for i in range(count):
            await writer.send(_batch(i))
        await writer.aclose()

    thread = threading.Thread(target=asyncio.run, args=(run(),), daemon=True)
    thread.start()
    return thread


def _lease_of(arr: np.ndarray) -> object:
    base: object = arr
    while isinstance(base, (np.ndarray, memoryview)):
        base = base.base if isinstance(base, np.ndarray) else base.obj
    return base


def _slot_backed(batch: dict[str, Any]) -> bool:
    """Whether the batch's array lies in a slot (a lease: a ctypes array made with from_buffer,
    which keeps the slot's mapping in ``_objects``; a file's own mapping has none)."""
    lease = _lease_of(batch["x"])
    return isinstance(lease, ctypes.Array) and bool(lease._objects)  # type: ignore[attr-defined]


def test_layout_aligns_each_buffer() -> None:
    offsets, need = layout([1, 64, 65, 0, 3])
    assert offsets == [0, 64, 128, 256, 256]
    assert need == 320


def test_released_slots_are_reused(link: tuple[Connection, Connection, socket.socket, socket.socket]) -> None:
    a, b, theirs, ours = link
    slabs = SlabViews(ours)
    before = _slabs_mapped()
    thread = _produce(b, theirs, 40)
    smalls = []  # kept, as a loop keeps labels for its metrics: they hold no slot
    for i in range(40):
        got = recv_object(a, ours, slabs)
        smalls.append(got["small"])
        assert got["i"] == i
        assert (got["x"] == i).all()
        np.testing.assert_array_equal(got["small"], np.arange(5) + i)
        assert got["x"].flags.writeable
        assert isinstance(_lease_of(got["x"]), ctypes.Array)
        del got  # released: the worker may fill its slot again
    thread.join(timeout=10)
    # The producer runs at most FD_IN_FLIGHT ahead: a few slots serve all 40 batches.
    assert 1 <= _slabs_mapped() - before <= FD_IN_FLIGHT + 2
    assert [int(x[0]) for x in smalls] == list(range(40))
    slabs.close()


def test_held_batches_are_never_overwritten(link: tuple[Connection, Connection, socket.socket, socket.socket]) -> None:
    a, b, theirs, ours = link
    slabs = SlabViews(ours)
    count = MAX_SLOTS + 6  # more than the ring holds: the rest go as files of their own
    thread = _produce(b, theirs, count)
    held = [recv_object(a, ours, slabs) for _ in range(count)]
    thread.join(timeout=10)
    assert not thread.is_alive()
    for i, got in enumerate(held):
        assert got["i"] == i
        assert (got["x"] == i).all(), f"batch {i} was overwritten while held"
    leases = {id(_lease_of(got["x"])) for got in held}
    assert len(leases) == count
    slabs.close()


def test_a_batch_held_past_close_stays_valid_and_its_mapping_goes_with_it(
    link: tuple[Connection, Connection, socket.socket, socket.socket],
) -> None:
    a, b, theirs, ours = link
    gc.collect()
    before = _slabs_mapped()
    slabs = SlabViews(ours)
    thread = _produce(b, theirs, 3)
    held = [recv_object(a, ours, slabs) for _ in range(3)]
    thread.join(timeout=10)
    slabs.close()  # the worker side is gone too (its ring with its thread's loop)
    del slabs
    gc.collect()
    for i, got in enumerate(held):
        assert (got["x"] == i).all()
    assert _slabs_mapped() > before  # the held batches keep their slots mapped
    del held, got
    # Reference counting alone unmaps them (no collection needed); the producer's
    # ring went with its objects.
    gc.collect()
    assert _slabs_mapped() == before


def test_ring_falls_back_when_full_and_reuses_the_smallest_fit() -> None:
    ring = SlabRing(max_slots=2, max_bytes=1 << 30)
    first = ring.take(100_000)
    second = ring.take(10_000)
    assert first is not None
    assert second is not None
    assert first.new_fd is not None
    assert second.new_fd is not None
    assert ring.take(10) is None  # every slot held, no room for another
    ring.release(first.slot)
    ring.release(second.slot)
    again = ring.take(5_000)
    assert again is not None
    assert again.slot == second.slot
    assert again.new_fd is None


    for fd in (first.new_fd, second.new_fd):
        os.close(fd)


def test_loader_batches_held_over_epochs_stay_intact(tmp_path: Path) -> None:
    from astream import Loader, MDSWriter, StreamingDataset

    n, width = 400, 16 * 1024  # batches of 8 x 16 KB: 128 KB arrays, in slots
    with MDSWriter(tmp_path / "ds", {"id": "int64", "x": "ndarray:uint8:16384"}, size_limit="1mb") as writer:
        for i in range(n):
            writer.write({"id": i, "x": np.full(width, i % 251, np.uint8)})
    ds = StreamingDataset(local=str(tmp_path / "ds"), batch_size=8)
    try:
        with Loader(ds, num_workers=2) as loader:
            # (The first epoch's batches may come from the stand-ins in this process.)
            epochs = [list(loader) for _ in range(3)]  # 50 batches each, all held
            for batches in epochs:
                assert sorted(int(i) for b in batches for i in b["id"]) == list(range(n))
                for b in batches:
                    np.testing.assert_array_equal(b["x"], np.repeat((b["id"] % 251).astype(np.uint8)[:, None], width, 1))
            # The workers' rings (16 slots each) filled once and, all held, were never
            # reused: the rest came through the pipe (or from the stand-ins, when the
            # workers had to start again on a loaded machine).
            backed = sum(_slot_backed(b) for batches in epochs for b in batches)
            assert 1 <= backed <= 2 * MAX_SLOTS
        held = [b for batches in epochs for b in batches]
        for b in held:  # closed: still valid
            assert (b["x"][:, 0] == b["id"] % 251).all()
    finally:
        ds.close()


def test_message_ring_reuses_only_what_the_consumer_read(
    link: tuple[Connection, Connection, socket.socket, socket.socket],
) -> None:
    _, _, _, ours = link
    ring = MessageRing(size=64 + 39_000, ordered=True)  # room for four 9 KB pickles, then 3 KB at the end
    first = ring.place(b"a" * 9_000)
    assert first is not None
    at, end, fd = first
    assert (at, end) == (0, 9_000)
    assert fd is not None  # its file comes with the first pickle
    views = SlabViews(ours)
    try:
        views.install_messages(fd, ring.size)
    finally:
        os.close(fd)
    assert ring.place(b"x" * 100) is None  # too small: through the pipe
    assert ring.place(b"x" * 9_751) is None  # over a quarter of the ring: through the pipe
    placed = [ring.place(bytes([c]) * 9_000) for c in b"bcd"]
    assert [p[:2] if p else None for p in placed] == [(9_000, 18_000), (18_000, 27_000), (27_000, 36_000)]
    assert ring.place(b"e" * 9_000) is None  # the front is free only once the consumer read it
    view = views.message(0, 9_000)
    assert view is not None
    assert bytes(view) == b"a" * 9_000
    views.message_read(9_000)
    again = ring.place(b"e" * 9_000)  # the end's 3 KB skipped: at 0 again
    assert again is not None
    assert again[:2] == (0, 48_000)
    view = views.message(0, 9_000)
    assert view is not None
    assert bytes(view) == b"e" * 9_000  # what the worker wrote, where the head says
    assert ring.place(b"f" * 9_000) is None  # full again until the consumer reads on
    assert views.message(35_000, 9_000) is None  # past the ring: refused, not read
    views.close()


def test_message_ring_is_not_used_where_stores_may_pass_loads() -> None:
    # (On a weakly ordered CPU the worker could see the consumer's count before its reads.)
    assert MessageRing(ordered=False).place(b"a" * 9_000) is None
    placed = MessageRing(ordered=True).place(b"a" * 9_000)
    assert placed is not None
    assert placed[2] is not None
    os.close(placed[2])


def test_small_batches_cross_in_the_ring_in_order_also_when_it_fills(
    link: tuple[Connection, Connection, socket.socket, socket.socket],
) -> None:
    a, b, theirs, ours = link
    batches = [{"i": i, "ids": np.arange(32) + i, "payload": [bytes([i % 251, j]) * 450 for j in range(32)]}
               for i in range(120)]
    batches[7] = {"i": 7, "x": np.full(ROWS, 7, np.float32)}  # a large one: in a slot
    batches[8] = {"i": 8}  # a tiny one: through the pipe

    async def run() -> None:
        writer = await PipeWriter.open(b, theirs)
        writer._messages = MessageRing(size=64 + 200_000, ordered=True)  # room for six: it fills, and wraps
        for batch in batches:
            await writer.send(batch)
        await writer.aclose()

    thread = threading.Thread(target=asyncio.run, args=(run(),), daemon=True)
    thread.start()
    time.sleep(0.3)  # the producer fills the ring, then the pipe, and waits
    views = SlabViews(ours)
    for batch in batches:
        got = recv_object(a, ours, views)
        assert list(got) == list(batch)
        for key, value in batch.items():
            if isinstance(value, np.ndarray):
                np.testing.assert_array_equal(got[key], value)
                assert got[key].flags.writeable
            else:
                assert got[key] == value
    thread.join(timeout=10)
    assert not thread.is_alive()
    assert views.message(0, 1) is not None  # the ring was announced and used
    views.close()
