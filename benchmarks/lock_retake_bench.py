"""What letting go of the interpreter lock costs a thread beside a busy Python thread.

A call that lets go of the lock (a system call, numpy's copies, zstd) must take it back
when it returns. Alone, that is free. Beside a thread running Python (the iteration of a
cold epoch), the lock is taken by that thread meanwhile and given back only at its switch
interval (5 ms by default) or when it lets go itself. This measures, per call, the time
alone and beside a thread that only runs Python, for the calls of a cold epoch's
hot paths:

- the reader's: a batch gather of 32 fixed-size 4 KB rows (``ndarray.take``), a sort of
  32 offsets, ``os.fstat``, a 4 KB ``os.pread``;
- the decoder's: the cache's zstd path (``stream_writer``, a Python ``write`` per output
  window) over one stored shard of the ``cold_bench`` zstd dataset, fed as the sink feeds
  it (lists of ~130 KB pieces per MB), with 128 KB and 1 MB output windows, pieces joined
  or not.

Usage::

    python benchmarks/lock_retake_bench.py
"""

from __future__ import annotations

import argparse
import os
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cold_bench import BENCH_DATA, build_datasets, shard_files

PIECE = 137 << 10  # the mean piece aiohttp hands the sink on loopback (64-256 KB)


class _Spinner:
    """A thread that runs Python until stopped (never lets go of the lock on its own)."""

    def __init__(self) -> None:
        self._stop = False
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        x = 0
        while not self._stop:
            x += 1

    def __enter__(self) -> _Spinner:
        self._thread.start()
        time.sleep(0.01)
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop = True
        self._thread.join()


def _per_call(fn: Callable[[], object], n: int) -> float:
    t = time.perf_counter()
    for _ in range(n):
        fn()
    return (time.perf_counter() - t) / n


def reader_calls(runs: int) -> None:
    rows = np.zeros((4096, 4096), np.uint8)
    idx = np.random.default_rng(1).integers(0, 4096, 32)
    out = np.empty((32, 4096), np.uint8)
    offsets = idx.astype(np.int64)
    fd = os.open(__file__, os.O_RDONLY)
    calls: dict[str, Callable[[], object]] = {
        "take 32 rows of 4 KB (a batch gather)": lambda: rows.take(idx, axis=0, out=out),
        "np.sort of 32 offsets": lambda: np.sort(offsets, kind="stable"),
        "os.fstat": lambda: os.fstat(fd),
        "os.pread 4 KB": lambda: os.pread(fd, 4096, 0),
    }
    print("| call | alone us | beside a busy Python thread us |")
    print("|---|---:|---:|")
    try:
        for name, fn in calls.items():
            alone = min(_per_call(fn, 300) for _ in range(runs))
            busy = []
            for _ in range(runs):
                with _Spinner():
                    busy.append(_per_call(fn, 300))
            print(f"| {name} | {alone * 1e6:.1f} | {sorted(busy)[len(busy) // 2] * 1e6:.1f} |")
    finally:
        os.close(fd)


def decoder(stored: bytes, window: int, join: bool, out_path: str) -> None:
    import zstandard

    pieces = [stored[i : i + PIECE] for i in range(0, len(stored), PIECE)]
    buffers: list[list[bytes]] = [[]]
    size = 0
    for p in pieces:  # lists of >= 1 MB, as the sink hands them to its thread
        buffers[-1].append(p)
        size += len(p)
        if size >= 1 << 20:
            buffers.append([])
            size = 0
    with open(out_path, "wb", buffering=0) as fh:

        class Emit:
            def write(self, data: bytes) -> int:
                view = memoryview(data)
                while view:
                    view = view[fh.write(view) or 0 :]
                return len(data)

        writer = zstandard.ZstdDecompressor().stream_writer(Emit(), write_size=window, write_return_read=True,
                                                            closefd=False)
        for chunks in buffers:
            for chunk in [b"".join(chunks)] if join else chunks:
                writer.write(chunk)
        writer.flush()


def decoder_calls(stored: bytes, runs: int) -> None:
    print(f"\n| zstd path over one stored shard ({len(stored) / 1e6:.0f} MB) | alone s | beside a busy Python thread s |")
    print("|---|---:|---:|")
    with tempfile.TemporaryDirectory() as scratch:
        out = os.path.join(scratch, "out")
        for window, join in ((128 << 10, False), (1 << 20, False), (1 << 20, True)):
            alone, busy = [], []
            for _ in range(runs):
                t = time.perf_counter()
                decoder(stored, window, join, out)
                alone.append(time.perf_counter() - t)
                with _Spinner():
                    t = time.perf_counter()
                    decoder(stored, window, join, out)
                    busy.append(time.perf_counter() - t)
            what = f"{window >> 10} KB windows, {'pieces joined per MB' if join else 'piece by piece'}"
            print(f"| {what} | {sorted(alone)[runs // 2]:.3f} | {sorted(busy)[runs // 2]:.3f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--data", default=str(BENCH_DATA / "cold"))
    parser.add_argument("--zstd-mb", type=int, default=300)
    args = parser.parse_args()
    root = Path(args.data) / "root"
    build_datasets(root, ["zstd"], args.zstd_mb)
    print(f"load average {os.getloadavg()[0]:.1f}; switch interval {sys.getswitchinterval() * 1e3:.0f} ms\n")
    reader_calls(args.runs)
    decoder_calls(shard_files(root, "zstd")[0].read_bytes(), args.runs)
    print(f"\nload average {os.getloadavg()[0]:.1f} at the end")


if __name__ == "__main__":
    main()
