from __future__ import annotations

import asyncio
import ctypes
import multiprocessing as mp
import os
import signal
import socket
import threading
import time
from collections.abc import AsyncIterator, Iterator
from contextlib import asynccontextmanager
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import Any

import numpy as np
import pytest

from astream._dataset.read.collate import collate_samples, concat_batches
from astream._dataset.transport import codec
from astream._dataset.transport.pipe import (
    FD_IN_FLIGHT,
    FD_MIN_BYTES,
    INBAND_MAX_BYTES,
    PipeReader,
    PipeWriter,
    fd_passing_supported,
    recv_object,
    recv_rest,
    send_object,
)
from astream._dataset.transport.slabs import SlabViews
from astream._dataset.workers.pool import WorkerPool
from astream.errors import WorkerError


def test_batch_round_trips_through_a_pipe_writable() -> None:
    a, b = mp.Pipe(duplex=False)
    batch = {
        "x": np.arange(3 * 1000, dtype=np.float32).reshape(3, 1000),
        "y": np.array([1, 2, 3]),
        "empty": np.zeros((0, 4), dtype=np.uint8),
        "s": ["a", "bé", ""],
    }
    t = threading.Thread(target=send_object, args=(b, batch))
    t.start()
    got = recv_object(a)
    t.join()
    assert set(got) == set(batch)
    for key in ("x", "y", "empty"):
        np.testing.assert_array_equal(got[key], batch[key])
        assert got[key].dtype == batch[key].dtype
        assert got[key].flags.writeable
    assert got["s"] == batch["s"]


def test_non_contiguous_arrays_survive() -> None:
    a, b = mp.Pipe(duplex=False)
    arr = np.arange(100, dtype=np.int64).reshape(10, 10)[:, ::3]
    t = threading.Thread(target=send_object, args=(b, {"a": arr}))
    t.start()
    got = recv_object(a)
    t.join()
    np.testing.assert_array_equal(got["a"], arr)


def test_small_buffers_travel_in_the_pickle_and_arrive_writable() -> None:
    small = np.arange(32, dtype=np.int64)
    frozen = np.frombuffer(b"abcdefgh", dtype=np.uint8)
    big = np.zeros(INBAND_MAX_BYTES, dtype=np.uint8)
    _, raws = codec.pickled({"small": small, "frozen": frozen, "big": big, "s": ["x"]})
    # One message for a batch of ids and strings: not one more per small array.
    assert [r.nbytes for r in raws] == [big.nbytes]
    a, b = mp.Pipe(duplex=False)
    t = threading.Thread(target=send_object, args=(b, {"small": small, "frozen": frozen}))
    t.start()
    got = recv_object(a)
    t.join()
    np.testing.assert_array_equal(got["small"], small)
    np.testing.assert_array_equal(got["frozen"], frozen)
    assert got["small"].flags.writeable
    assert not got["frozen"].flags.writeable  # as it was sent (and as out of band before)


def test_small_arrays_of_a_batch_travel_packed_and_arrive_as_sent() -> None:
    frozen = np.arange(6, dtype=">i4").reshape(2, 3)  # big-endian, read-only
    frozen.flags.writeable = False
    shared = np.arange(3)
    batch: dict[Any, Any] = {
        "ids": np.arange(32, dtype=np.int64), "name": ["a", "bé"], "flag": np.array([True, False]),
        "when": np.array(["2026-12-01T10:00"], dtype="datetime64[ns]"), "zero_d": np.array(2.5, np.float32),
        "empty": np.zeros((0, 4), np.uint8), "frozen": frozen, "cplx": np.array([1 + 2j], np.complex64),
        "fortran": np.asfortranarray(np.arange(6.0).reshape(2, 3)), "fields": np.zeros(2, [("a", "i4"), ("b", "f8")]),
        "objects": np.array([1, "x"], dtype=object), 7: np.arange(2, dtype=np.uint16),
    }
    wire, packed = codec.packed(("batch", batch))
    assert packed
    assert [pack[0] for pack in wire[2]] == ["ids", "flag", "when", "zero_d", "empty", "frozen", "cplx", 7]
    # numpy's reduce names its functions and the dtype's class in every array's pickle;
    # a batch of ids and strings pickles without any.
    payload, raws = codec.pickled(codec.packed(("batch", {"ids": batch["ids"], "name": batch["name"]}))[0])
    assert not raws
    assert b"numpy" not in payload
    a, b = mp.Pipe(duplex=False)
    messages = [("batch", batch), ("batch", {"a": shared, "b": shared}), ("end", {"x": np.arange(2)})]
    t = threading.Thread(target=lambda: [send_object(b, m) for m in messages])
    t.start()
    kind, got = recv_object(a)
    assert kind == "batch"
    assert list(got) == list(batch)  # the keys in their order
    for key, value in batch.items():
        if isinstance(value, np.ndarray):
            assert type(got[key]) is np.ndarray
            assert got[key].dtype == value.dtype, key
            assert got[key].shape == value.shape, key
            np.testing.assert_array_equal(got[key], value)
            assert got[key].flags.writeable == value.flags.writeable, key
            assert got[key].flags.c_contiguous == value.flags.c_contiguous, key
        else:
            assert got[key] == value
    _, twice = recv_object(a)
    assert twice["a"] is twice["b"]  # one array under two keys: one object, as pickled
    assert recv_object(a)[1]["x"].tolist() == [0, 1]
    t.join()
    a.close()
    b.close()


def test_large_strided_columns_still_travel_contiguous_out_of_band() -> None:
    rows = np.arange(64 * 4096, dtype=np.int64).reshape(4096, 64)
    column = rows[:, 3]  # strided, as a column of fixed-size records' rows
    wide = rows[:, :40]  # 1.3 MB, strided
    batch = {"ids": np.arange(4), "s": ["a", "b"], "wide": wide, "column": column}
    assert not codec.plain(("batch", batch))  # the override's pickler, for the strided columns
    assert codec.plain(("batch", {"ids": np.arange(4), "s": ["a"], "rows": rows}))  # contiguous: the plain one
    assert not codec.plain(["batch", batch])  # not a message of the usual shape: the override's pickler
    _, raws = codec.pickled(("batch", batch))
    assert [r.nbytes for r in raws] == [wide.nbytes]  # made contiguous, out of band; the column in band
    a, b = mp.Pipe(duplex=False)
    for message in (("batch", batch), ("batch", {"ids": np.arange(4), "s": ["a"], "rows": rows})):
        t = threading.Thread(target=send_object, args=(b, message))
        t.start()
        kind, got = recv_object(a)
        t.join()
        assert kind == "batch"
        assert set(got) == set(message[1])
        for key, value in message[1].items():
            if isinstance(value, np.ndarray):
                np.testing.assert_array_equal(got[key], value)
                assert got[key].flags.writeable
            else:
                assert got[key] == value
    a.close()
    b.close()


def _sender(conn: Connection, messages: list[bytes]) -> None:
    for message in messages:
        conn.send_bytes(message)
    conn.close()


@pytest.mark.parametrize("chunk", [64, 4096, 1 << 20])
def test_pipe_reader_reads_what_a_connection_sends(chunk: int) -> None:
    # Sizes around the chunk and its half (where a message stops being a view of the
    # buffer), and one over 64 KiB (a pipe's default size: it arrives in pieces).
    sizes = [0, 1, 5, 31, 32, 33, 63, 64, 65, 200, 4095, 4096, 70_000, 3, 2, 1 << 20, 0, 17]
    messages = [bytes((i * 7 + j) % 251 for j in range(n)) for i, n in enumerate(sizes)]
    a, b = mp.Pipe(duplex=False)
    t = threading.Thread(target=_sender, args=(b, messages))
    t.start()
    reader = PipeReader(a, chunk=chunk)
    try:
        for i, message in enumerate(messages):
            if i % 3 == 2:
                buf = bytearray(len(message))
                assert reader.recv_bytes_into(buf) == len(message)
                assert bytes(buf) == message
            else:
                assert bytes(reader.recv_bytes()) == message
        with pytest.raises(EOFError):
            reader.recv_bytes()
    finally:
        a.close()
        t.join()


def test_pipe_reader_buffers_several_messages_per_read() -> None:
    a, b = mp.Pipe(duplex=False)
    for n in (10, 20, 30):
        b.send_bytes(bytes([n]) * n)
    reader = PipeReader(a)
    assert not reader.buffered()  # nothing read yet
    assert bytes(reader.recv_bytes()) == bytes([10]) * 10
    assert reader.buffered()  # the other two came with the same read
    assert bytes(reader.recv_bytes()) == bytes([20]) * 20
    assert bytes(reader.recv_bytes()) == bytes([30]) * 30
    assert not reader.buffered()
    a.close()
    b.close()


def test_batches_through_a_pipe_reader_with_buffers_out_of_band() -> None:
    # A small chunk: reading a batch's out-of-band buffers reuses the memory its head
    # (the pickle) was read into, so the head must have been copied first.
    batches = [
        {"x": np.full(INBAND_MAX_BYTES // 8 + i, i, dtype=np.int64), "y": np.arange(i + 1), "s": ["é" * i, "b"],
         "z": np.full(INBAND_MAX_BYTES + i, i + 1, dtype=np.uint8)}
        for i in range(6)
    ]
    a, b = mp.Pipe(duplex=False)

    def send_all() -> None:
        for batch in batches:
            send_object(b, batch)

    t = threading.Thread(target=send_all)
    t.start()
    reader = PipeReader(a, chunk=1024)
    try:
        for batch in batches:
            got = recv_rest(reader, reader.recv_bytes())
            assert set(got) == set(batch)
            np.testing.assert_array_equal(got["x"], batch["x"])
            np.testing.assert_array_equal(got["y"], batch["y"])
            np.testing.assert_array_equal(got["z"], batch["z"])
            assert got["x"].flags.writeable
            assert got["y"].flags.writeable
            assert got["s"] == batch["s"]
    finally:
        a.close()  # first: a sender still blocked on a full pipe gets an error, not a hang
        t.join()
        b.close()


def test_collate_stacks_matching_arrays_and_keeps_ragged_as_list() -> None:
    samples = [
        {"x": np.ones((2, 3), np.float32) * i, "r": np.arange(i + 1), "n": i, "s": str(i), "big": 2**70}
        for i in range(4)
    ]
    batch = collate_samples(samples)
    assert isinstance(batch["x"], np.ndarray)
    assert batch["x"].shape == (4, 2, 3)
    assert isinstance(batch["r"], list)
    np.testing.assert_array_equal(batch["n"], [0, 1, 2, 3])
    assert batch["s"] == ["0", "1", "2", "3"]
    assert batch["big"] == [2**70] * 4


def test_concat_batches_joins_arrays_and_lists() -> None:
    a = {"x": np.zeros((2, 3)), "s": ["a", "b"]}
    b = {"x": np.ones((1, 3)), "s": ["c"]}
    out = concat_batches([a, b])
    assert isinstance(out["x"], np.ndarray)
    assert out["x"].shape == (3, 3)
    assert out["s"] == ["a", "b", "c"]
    mixed = concat_batches([{"x": np.zeros((1, 2))}, {"x": np.zeros((1, 3))}])
    assert isinstance(mixed["x"], list)
    assert len(mixed["x"]) == 2


def _fd_count() -> int:
    """Descriptors of the transport's anonymous batch files open in this process.

    Only those: other tests' node agents and threads, winding down in the same process,
    open and close sockets of their own meanwhile.
    """
    count = 0
    for fd in os.listdir("/proc/self/fd"):
        try:
            count += os.readlink(f"/proc/self/fd/{fd}").startswith("/memfd:astream-batch")
        except OSError:
            continue  # closed while listed
    return count


def _root(arr: np.ndarray) -> object:
    """What an array's memory belongs to, under the arrays and views over it."""
    base: object = arr
    while isinstance(base, (np.ndarray, memoryview)):
        base = base.base if isinstance(base, np.ndarray) else base.obj
    return base


@pytest.fixture
def channels() -> Iterator[tuple[Connection, Connection, socket.socket, socket.socket]]:
    """A pipe (reading end, writing end) and the socket pair beside it (producer's, consumer's)."""
    a, b = mp.Pipe(duplex=False)
    theirs, ours = socket.socketpair()
    try:
        yield a, b, theirs, ours
    finally:
        for end in (a, b, theirs, ours):
            end.close()


@pytest.mark.skipif(not fd_passing_supported(), reason="no memfd_create / descriptor passing here")
def test_large_buffers_travel_as_files_small_ones_through_the_pipe(
    channels: tuple[Connection, Connection, socket.socket, socket.socket],
) -> None:
    a, b, theirs, ours = channels
    big = np.arange(FD_MIN_BYTES // 4 + 123, dtype=np.float32)  # over the threshold
    small = np.arange(1000, dtype=np.int64)
    before = _fd_count()
    got = []
    for _ in range(FD_IN_FLIGHT + 3):  # more than the credits: the acks come back
        batch = {"big": big, "small": small, "s": ["x"]}
        t = threading.Thread(target=send_object, args=(b, batch, theirs))
        t.start()
        got.append(recv_object(a, ours))
        t.join()
    for item in got:
        np.testing.assert_array_equal(item["big"], big)
        np.testing.assert_array_equal(item["small"], small)
        assert item["s"] == ["x"]
        assert item["big"].flags.writeable
        assert item["small"].flags.writeable
        # The large one is a mapping of its own, the small one a buffer read from the pipe.
        assert isinstance(_root(item["small"]), bytearray)
        assert isinstance(_root(item["big"]), ctypes.Array)
        item["big"][:] = 7  # writable for real, and private to this batch
    assert all(int(item["big"][0]) == 7 for item in got)
    assert _fd_count() == before  # the descriptors are closed once mapped


@pytest.mark.skipif(not fd_passing_supported(), reason="no memfd_create / descriptor passing here")
def test_large_buffers_through_a_pipe_writer_with_back_pressure(
    channels: tuple[Connection, Connection, socket.socket, socket.socket],
) -> None:
    a, b, theirs, ours = channels
    arrays = [np.full(FD_MIN_BYTES, i, dtype=np.uint8) for i in range(FD_IN_FLIGHT + 4)]
    sent: list[int] = []

    async def produce() -> None:
        writer = await PipeWriter.open(b, theirs)
        for i, arr in enumerate(arrays):
            await writer.send({"i": i, "x": arr})
            sent.append(i)
        await writer.aclose()

    t = threading.Thread(target=asyncio.run, args=(produce(),))
    t.start()
    deadline = time.monotonic() + 10
    while len(sent) < FD_IN_FLIGHT and time.monotonic() < deadline:
        time.sleep(0.01)
    time.sleep(0.2)
    # Nothing received yet: the producer sent as many as its credits allow, then waits.
    assert len(sent) == FD_IN_FLIGHT
    slabs = SlabViews(ours)
    for i in range(len(arrays)):
        got = recv_object(a, ours, slabs)
        assert got["i"] == i
        np.testing.assert_array_equal(got["x"], arrays[i])
    t.join(timeout=10)
    assert not t.is_alive()


@dataclass
class BigJob:
    """Worker w yields ``counts[w]`` batches with a large array full of w*100 + i."""

    counts: tuple[int, ...]
    die_worker: int | None = None
    die_after: int = 0

    @asynccontextmanager
    async def open(self, worker_id: int, start_at: Any = None) -> AsyncIterator[AsyncIterator[dict[str, np.ndarray]]]:
        async def gen() -> AsyncIterator[dict[str, np.ndarray]]:
            for i in range(self.counts[worker_id]):
                if worker_id == self.die_worker and i == self.die_after:
                    os.kill(os.getpid(), signal.SIGKILL)
                await asyncio.sleep(0)
                value = worker_id * 100 + i
                yield {"big": np.full(FD_MIN_BYTES // 4 + 5, value, np.float32), "small": np.array([value])}

        yield gen()


async def _collect_big(job: BigJob, n: int) -> list[dict]:
    async with WorkerPool(job, n, "process", prefetch=2, loop_factory=asyncio.new_event_loop) as pool:
        return [b async for b in pool.batches()]


async def test_large_batches_from_worker_processes_in_order() -> None:
    batches = await asyncio.wait_for(_collect_big(BigJob((6, 2, 5)), 3), 60)
    expected = [0, 100, 200, 1, 101, 201, 2, 202, 3, 203, 4, 204, 5]
    assert [int(b["small"][0]) for b in batches] == expected
    for b, value in zip(batches, expected, strict=True):
        assert b["big"].flags.writeable
        assert (b["big"] == value).all()
        assert b["big"].shape == (FD_MIN_BYTES // 4 + 5,)
        if fd_passing_supported():
            assert isinstance(_root(b["big"]), ctypes.Array)


async def test_worker_killed_between_large_batches_surfaces() -> None:
    with pytest.raises(WorkerError, match="died without a word"):
        await asyncio.wait_for(_collect_big(BigJob((40, 40), die_worker=1, die_after=7), 2), 60)


async def test_early_close_with_large_batches_in_flight() -> None:
    pool = WorkerPool(BigJob((10_000, 10_000)), 2, "process", prefetch=2, loop_factory=asyncio.new_event_loop)
    async with pool:
        got = 0
        async for _ in pool.batches():
            got += 1
            if got == 5:
                break
    for worker in pool._processes:
        assert not worker.proc.is_alive()
    for thread in [*pool._threads, *(w.thread for w in pool._processes if w.thread is not None)]:
        assert not thread.is_alive()
