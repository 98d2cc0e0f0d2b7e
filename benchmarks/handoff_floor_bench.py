"""The floor of a small batch's way from a worker process to the consumer: CPU per batch.

What it does:

1. Takes ``--batches`` batches of 32 of the ``small`` set of ``peers_bench.py`` (50,000 x
   ~1 KB of ``id: int``, ``name: str``, ``payload: bytes``; built there, under
   ``--data``), read by ``Loader(ds, batch_size=32)`` without workers, in a producer
   process started for the purpose (the values it sends are its own objects, as a
   worker's decoded batches are).
2. The producer sends them ``--passes`` times over, in one of three ways, to this process,
   whose one reader thread rebuilds each batch (what a loader's reader thread does):

   - ``pipe``: astream's transport as a worker uses it: the batch packed and pickled
     (:func:`astream._dataset.transport._packed`, ``_pickled``), its head and pickle
     written into the worker's pipe (1 MiB, as :mod:`astream._dataset.spawn` widens it)
     with one ``os.writev``, read by a :class:`~astream._dataset.transport.PipeReader`
     and rebuilt by ``recv_rest``;
   - ``shm``: the cheapest hand-off of the same objects that still carries them between
     processes: the same pickle copied into a ring of shared memory mapped by both
     (4 MiB), a 16-byte note through the pipe, the pickle loaded from the ring in place;
     the consumer marks what it has read in the ring's header (no message back), and
     the producer reuses that room;
   - ``pickle``: only pickling (producer) and unpickling a copy of the pickle (consumer,
     from memory, no transport): what any hand-off of Python objects pays.

3. Reports µs of CPU per batch of the producer (its process) and of the consumer (the
   reader thread: ``time.thread_time``), the minimum and median over ``--runs`` runs,
   the modes alternated. The load average is printed beside them.

The decode of the batch (in the worker, as without workers in the consumer's loop) and
the hand-over from the reader thread to the user's thread come on top of each mode:
they are the same for every transport.

Usage::

    .venv/bin/python benchmarks/handoff_floor_bench.py --runs 5
"""

from __future__ import annotations

import argparse
import mmap
import os
import pickle
import statistics
import struct
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

BENCH_DATA = Path(os.environ.get("ASTREAM_BENCH_DATA", Path(tempfile.gettempdir()) / "astream-bench"))
RING = 4 << 20
_HEADER = 64  # the ring's first cache line: the consumer's count of bytes read (its "freed")
_NOTE = struct.Struct("<QQ")  # offset in the ring, size of the pickle
_FREED = struct.Struct("<Q")
MODES = ("pipe", "shm", "pickle")


def _batches(root: Path, n: int) -> list[dict[str, object]]:
    from astream import Loader, StreamingDataset

    ds = StreamingDataset(local=str(root / "small"), batch_size=32, shuffle=False)
    out = []
    with Loader(ds) as loader:
        for batch in loader:
            out.append(batch)
            if len(out) == n:
                break
    return out


def producer(root: Path, mode: str, fd: int, ring_fd: int, n: int, passes: int) -> None:
    from astream._dataset.spawn import _widen
    from astream._dataset.transport import _LENGTH, _packed, _pickled, _prefix

    batches = _batches(root, n)
    ring = mmap.mmap(ring_fd, RING)
    view = memoryview(ring)
    os.write(fd, b"R")  # ready: the consumer starts its clock
    began = time.process_time()
    if mode == "pipe":
        conn = type("C", (), {"fileno": lambda self: fd})()
        _widen(conn)  # type: ignore[arg-type]
        for _ in range(passes):
            for batch in batches:
                wire, packed = _packed(("batch", batch))
                payload, raws = _pickled(wire)
                head = _prefix(raws, set(), packed=packed)
                os.writev(fd, [_LENGTH.pack(len(head) + len(payload)), head, payload])
    elif mode == "shm":
        written = 0  # bytes of the ring used so far (a count that only grows, as "freed")
        for _ in range(passes):
            for batch in batches:
                wire, _ = _packed(("batch", batch))
                payload = pickle.dumps(wire, protocol=5)
                size = len(payload)
                at = written % (RING - _HEADER)
                if at + size > RING - _HEADER:  # no room before the end: start again at 0
                    written += RING - _HEADER - at
                    at = 0
                while written + size - _FREED.unpack_from(view, 0)[0] > RING - _HEADER:
                    time.sleep(0.0002)  # full (the consumer is behind): wait for room, idle
                view[_HEADER + at : _HEADER + at + size] = payload
                written += size
                os.write(fd, _NOTE.pack(at, size) + _FREED.pack(written))
    else:
        for _ in range(passes):
            for batch in batches:
                pickle.dumps(_packed(("batch", batch))[0], protocol=5)
    cpu = time.process_time() - began
    os.write(2, f"producer_us {cpu / (n * passes) * 1e6:.2f}\n".encode())
    view.release()
    ring.close()


def consumer(mode: str, r: int, ring: mmap.mmap, count: int, copies: list[bytes]) -> float:
    """CPU µs per batch of the thread that rebuilds ``count`` batches."""
    from astream._dataset.transport import PipeReader, _unpacked, recv_rest

    view = memoryview(ring)
    conn = type("C", (), {"fileno": lambda self: r})()
    reader = PipeReader(conn)  # type: ignore[arg-type]
    assert os.read(r, 1) == b"R"
    began = time.thread_time()
    if mode == "pipe":
        for _ in range(count):
            recv_rest(reader, reader.recv_bytes())
    elif mode == "shm":
        note = _NOTE.size + _FREED.size
        for _ in range(count):
            raw = bytes(reader._take(note))
            at, size = _NOTE.unpack_from(raw)
            (end,) = _FREED.unpack_from(raw, _NOTE.size)
            _unpacked(pickle.loads(view[_HEADER + at : _HEADER + at + size]))
            _FREED.pack_into(view, 0, end)  # the producer may reuse it
    else:
        for i in range(count):
            _unpacked(pickle.loads(copies[i % len(copies)]))
    cpu = time.thread_time() - began
    view.release()
    return cpu / count * 1e6


def run(root: Path, mode: str, n: int, passes: int) -> tuple[float, float]:
    from astream._dataset.transport import _packed

    r, w = os.pipe()
    ring_fd = os.memfd_create("floor-ring")
    os.ftruncate(ring_fd, RING)
    ring = mmap.mmap(ring_fd, RING)
    copies: list[bytes] = []
    if mode == "pickle":
        copies = [pickle.dumps(_packed(("batch", b))[0], protocol=5) for b in _batches(root, n)]
    cmd = [sys.executable, __file__, "--producer", mode, "--data", str(root), "--fd", str(w),
           "--ring-fd", str(ring_fd), "--batches", str(n), "--passes", str(passes)]
    proc = subprocess.Popen(cmd, pass_fds=(w, ring_fd), stderr=subprocess.PIPE, text=True)
    os.close(w)
    got: list[float] = []
    t = threading.Thread(target=lambda: got.append(consumer(mode, r, ring, n * passes, copies)))
    t.start()
    t.join()
    _, err = proc.communicate(timeout=600)
    os.close(r)
    os.close(ring_fd)
    ring.close()
    line = [x for x in err.splitlines() if x.startswith("producer_us")]
    if proc.returncode or not line:
        raise SystemExit(f"producer failed:\n{err[-2000:]}")
    return float(line[-1].split()[1]), got[0]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default=str(BENCH_DATA / "peers"))
    p.add_argument("--runs", type=int, default=5)
    p.add_argument("--batches", type=int, default=400)
    p.add_argument("--passes", type=int, default=25)
    p.add_argument("--producer", default=None, help=argparse.SUPPRESS)
    p.add_argument("--fd", type=int, default=-1, help=argparse.SUPPRESS)
    p.add_argument("--ring-fd", type=int, default=-1, help=argparse.SUPPRESS)
    args = p.parse_args()
    root = Path(args.data)
    if args.producer:
        producer(root, args.producer, args.fd, args.ring_fd, args.batches, args.passes)
        return
    if not (root / "small" / "index.json").exists():
        p.error(f"no small set under {root}: run benchmarks/peers_bench.py --libs astream once to build it")
    results: dict[str, list[tuple[float, float]]] = {m: [] for m in MODES}
    loads = []
    for _ in range(args.runs):
        for mode in MODES:
            results[mode].append(run(root, mode, args.batches, args.passes))
            loads.append(os.getloadavg()[0])
    print(f"load average {min(loads):.1f}-{max(loads):.1f}; µs of CPU per batch of 32, "
          f"{args.batches} batches x {args.passes} passes, min / median of {args.runs} runs")
    print("| mode | producer | consumer | total |")
    print("|---|---:|---:|---:|")
    for mode, rows in results.items():
        prod = [a for a, _ in rows]
        cons = [b for _, b in rows]
        tot = [a + b for a, b in rows]
        cell = lambda xs: f"{min(xs):.1f} / {statistics.median(xs):.1f}"  # noqa: E731
        print(f"| {mode} | {cell(prod)} | {cell(cons)} | {cell(tot)} |")


if __name__ == "__main__":
    main()
