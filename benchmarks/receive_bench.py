"""What receiving a shard's body costs the interpreter lock, per MB, against the cheapest way.

The cold epoch of a zstd dataset runs three things at once on the node: the body arriving
(the HTTP client on the engine's loop thread), the decoder (zstd in the engine's executor
thread: it lets go of the interpreter lock inside zstd) and the iteration (the reader's
thread). Only what holds the lock serialises with the iteration. This measures the CPU of
the receiving thread, user time (Python, copies: the lock is held) and system time (the
``recv`` calls: the lock is let go), per MB of stored bytes, for:

- ``astream``: :meth:`HttpStorage.fetch_into` (astream's client, on astream's loop) into a
  sink that only counts, i.e. the receive path alone;
- ``astream-shard``: the same into the cache's :class:`~astream._cache.install.ShardSink`
  (decompressed and written to a temporary file in the executor thread, as the cache
  does); the executor thread's CPU is reported apart;
- ``aiohttp-4m``: aiohttp's ``content.iter_chunked(4 MB)`` on a plain asyncio loop (large
  chunks: fewer steps, one join per chunk);
- ``socket-thread``: a blocking socket in a thread of its own reading the body with
  ``recv_into`` into one preallocated 4 MB buffer (the lock is let go during each ``recv``:
  the cheapest receive Python can make).

Every mode reads the stored shards of the ``cold_bench`` zstd dataset, one at a time, from a
:class:`~astream.testing.LoopbackServer` in its own process; medians over ``--runs``.

Usage::

    python benchmarks/receive_bench.py --runs 5
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from cold_bench import BENCH_DATA, build_datasets, shard_files
from loader_bench import child_env

MODES = ("astream", "astream-shard", "aiohttp-4m", "socket-thread")


def _thread_cpu() -> tuple[float, float]:
    """(user, system) CPU seconds of the calling thread."""
    usage = resource.getrusage(resource.RUSAGE_THREAD)
    return usage.ru_utime, usage.ru_stime


class _Counted:
    """A sink that only counts (the receive path alone)."""

    def __init__(self) -> None:
        self.received = 0

    async def write(self, data: bytes) -> None:
        self.received += len(data)

    async def restart(self) -> None:
        self.received = 0


def _task_cpu(native_ids: set[int]) -> float:
    """User + system CPU seconds of these threads of this process (from /proc)."""
    tick = os.sysconf("SC_CLK_TCK")
    total = 0.0
    for tid in native_ids:
        try:
            with open(f"/proc/self/task/{tid}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += (int(fields[11]) + int(fields[12])) / tick
    return total


def run_astream(urls: list[tuple[str, int, int]], shard_sink: bool, scratch: str) -> dict[str, float]:
    from astream._cache.install import ShardSink
    from astream._format.compression import get_codec
    from astream._storage.executor import PriorityExecutor
    from astream._storage.http import HttpStorage
    from astream._storage.loop import new_event_loop

    executor = PriorityExecutor(2)
    out: dict[str, float] = {}

    async def main() -> None:
        storage = HttpStorage()
        await storage.read_bytes(urls[0][0])  # the connection and aiohttp's first use, outside the timing
        before = {t.native_id for t in threading.enumerate() if t.native_id is not None}
        u0, s0 = _thread_cpu()
        p0 = time.process_time()
        t0 = time.perf_counter()
        for i, (url, stored, raw) in enumerate(urls):
            if shard_sink:
                sink = ShardSink(os.path.join(scratch, f"shard{i}.mds"), raw, codec=get_codec("zstd"),
                                 executor=executor, fsync=False)
                try:
                    await storage.fetch_into(url, sink, size=stored)
                    await sink.finish()
                finally:
                    sink.abort()
            else:
                await storage.fetch_into(url, _Counted(), size=stored)
        out["wall_s"] = time.perf_counter() - t0
        u1, s1 = _thread_cpu()
        out["recv_user_s"], out["recv_sys_s"] = u1 - u0, s1 - s0
        out["process_s"] = time.process_time() - p0
        workers = {t.native_id for t in threading.enumerate() if t.name.startswith("astream-io")} - before
        out["executor_s"] = _task_cpu({w for w in workers if w is not None})
        await storage.aclose()

    loop = new_event_loop()
    try:
        loop.run_until_complete(main())
    finally:
        loop.close()
        executor.shutdown()
    return out


def run_aiohttp(urls: list[tuple[str, int, int]]) -> dict[str, float]:
    import aiohttp

    out: dict[str, float] = {}

    async def main() -> None:
        async with aiohttp.ClientSession(auto_decompress=False, read_bufsize=4 << 20) as session:
            async with session.get(urls[0][0]) as resp:
                await resp.read()
            u0, s0 = _thread_cpu()
            p0 = time.process_time()
            t0 = time.perf_counter()
            for url, stored, _ in urls:
                got = 0
                async with session.get(url) as resp:
                    async for chunk in resp.content.iter_chunked(4 << 20):
                        got += len(chunk)
                assert got == stored, (url, got, stored)
            out["wall_s"] = time.perf_counter() - t0
            u1, s1 = _thread_cpu()
            out["recv_user_s"], out["recv_sys_s"] = u1 - u0, s1 - s0
            out["process_s"] = time.process_time() - p0

    asyncio.run(main())
    return out


def _get(sock: socket.socket, host: str, path: str, buf: memoryview) -> int:
    """One HTTP/1.1 GET on a kept-alive socket; the body read into ``buf`` over and over."""
    sock.sendall(f"GET {path} HTTP/1.1\r\nHost: {host}\r\n\r\n".encode())
    head = b""
    while b"\r\n\r\n" not in head:
        data = sock.recv(65536)
        if not data:
            raise ConnectionError("closed before the headers")
        head += data
    header, rest = head.split(b"\r\n\r\n", 1)
    length = next(int(line.split(b":", 1)[1]) for line in header.split(b"\r\n")
                  if line.lower().startswith(b"content-length:"))
    got = len(rest)
    while got < length:
        n = sock.recv_into(buf, min(len(buf), length - got))
        if not n:
            raise ConnectionError("closed before the body's end")
        got += n
    return got


def run_socket_thread(urls: list[tuple[str, int, int]]) -> dict[str, float]:
    host = urls[0][0].split("/")[2]
    name, port = host.rsplit(":", 1)
    out: dict[str, float] = {}

    def work() -> None:
        buf = memoryview(bytearray(4 << 20))
        with socket.create_connection((name, int(port))) as sock:
            _get(sock, host, "/" + urls[0][0].split("/", 3)[3], buf)
            u0, s0 = _thread_cpu()
            t0 = time.perf_counter()
            for url, stored, _ in urls:
                got = _get(sock, host, "/" + url.split("/", 3)[3], buf)
                assert got == stored, (url, got, stored)
            out["wall_s"] = time.perf_counter() - t0
            u1, s1 = _thread_cpu()
            out["recv_user_s"], out["recv_sys_s"] = u1 - u0, s1 - s0

    p0 = time.process_time()
    thread = threading.Thread(target=work)
    thread.start()
    thread.join()
    out["process_s"] = time.process_time() - p0
    return out


def worker(mode: str, base_url: str, root: str) -> dict[str, float]:
    files = shard_files(Path(root), "zstd")
    index = json.loads((Path(root) / "bucket" / "zstd" / "index.json").read_text())
    urls = [(f"{base_url}/bucket/zstd/{p.name}", p.stat().st_size, s["raw_data"]["bytes"])
            for p, s in zip(files, index["shards"], strict=True)]
    if mode == "socket-thread":
        res = run_socket_thread(urls)
    elif mode == "aiohttp-4m":
        res = run_aiohttp(urls)
    else:
        with tempfile.TemporaryDirectory() as scratch:
            res = run_astream(urls, mode == "astream-shard", scratch)
    res["mb"] = sum(u[1] for u in urls) / 1e6
    return res


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--data", default=str(BENCH_DATA / "cold"))
    parser.add_argument("--zstd-mb", type=int, default=300)
    parser.add_argument("--modes", nargs="*", default=list(MODES), choices=MODES)
    parser.add_argument("--worker", nargs=3, metavar=("MODE", "URL", "ROOT"))
    args = parser.parse_args()
    if args.worker:
        print(json.dumps(worker(*args.worker)))
        return
    data = Path(args.data)
    root = data / "root"
    build_datasets(root, ["zstd"], args.zstd_mb)
    env = child_env(data)
    server = subprocess.Popen(
        [sys.executable, "-c", "import sys; from astream.testing import LoopbackServer; "
         "s = LoopbackServer(sys.argv[1]).start(); print(s.port, flush=True); sys.stdin.read()", str(root)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env,
    )
    assert server.stdout is not None
    url = f"http://127.0.0.1:{int(server.stdout.readline())}"
    results: dict[str, list[dict[str, Any]]] = {m: [] for m in args.modes}
    loads = []
    try:
        for r in range(args.runs):
            for mode in args.modes if r % 2 == 0 else list(reversed(args.modes)):
                loads.append(os.getloadavg()[0])
                proc = subprocess.run([sys.executable, __file__, "--worker", mode, url, str(root)], env=env,
                                      capture_output=True, text=True, check=True)
                results[mode].append(json.loads(proc.stdout.strip().splitlines()[-1]))
    finally:
        server.stdin.close()  # type: ignore[union-attr]
        server.wait(10)
    mb = results[args.modes[0]][0]["mb"]
    print(f"\n{mb:.0f} MB stored (the zstd dataset's shards, one at a time), medians of {args.runs} fresh "
          f"processes; load average {min(loads):.1f}-{max(loads):.1f}\n")
    print("| mode | MB/s | receiving thread: user ms/MB (lock held) | system ms/MB (recv, lock let go) "
          "| executor ms/MB | process CPU ms/MB |")
    print("|---|---:|---:|---:|---:|---:|")
    for mode, rs in results.items():
        def med(key: str, rs: list[dict[str, Any]] = rs) -> float:
            return statistics.median(r.get(key, 0.0) for r in rs)
        executor = f"{1e3 * med('executor_s') / mb:.2f}" if mode == "astream-shard" else ""
        print(f"| {mode} | {mb / med('wall_s'):.0f} | {1e3 * med('recv_user_s') / mb:.2f} "
              f"| {1e3 * med('recv_sys_s') / mb:.2f} | {executor} | {1e3 * med('process_s') / mb:.2f} |")


if __name__ == "__main__":
    main()
