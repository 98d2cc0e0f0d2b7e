"""Cold pass over a dataset in each cloud emulator: astream against the client libraries.

What it does:

1. Starts gcp-storage-emulator (``python -m gcp_storage_emulator``, in memory) and Azurite
   (``azurite-blob --inMemoryPersistence``) as separate processes on 127.0.0.1.
2. Writes one MDS dataset (``--size-mb`` MB of 1 MiB samples, uncompressed, shards of
   ``--shard-mb``) into each with ``MDSWriter(out="gs://..." / "azure://...")`` (timed).
3. Runs each mode ``--runs`` times, interleaved, each into an empty folder, ``--concurrency``
   objects in flight, every shard written to a file (no fsync in any mode, so all do the
   same disk work; astream's own temp + rename is kept):

   - ``astream``: ``StoragePool.get(url).fetch(url, path, size=...)`` (ranged streaming reads
     under astream's retry policy), on uvloop when present.
   - ``client``: the library's own streaming download of the same objects:
     gcloud-aio-storage ``download_stream`` read in 1 MiB pieces; azure-storage-blob
     ``download_blob(max_concurrency=1).readinto(file)`` (its chunked ranged reads).
   - ``obstore``: the Rust object_store bindings (``obstore.get_async(...).stream()``),
     when ``obstore`` is installed.

4. Prints the median wall time and MB/s of each mode, and the ratios astream / client
   (target >= 0.9x) and obstore / astream.

Usage::

    .venv/bin/python benchmarks/remote_bench.py --size-mb 160 --runs 5
"""

from __future__ import annotations

import argparse
import asyncio
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any

import numpy as np

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
HOST = "127.0.0.1"


def _wait(port: int, timeout: float = 30) -> None:
    import socket

    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection((HOST, port), 0.2).close()
            return
        except OSError:
            time.sleep(0.1)
    raise RuntimeError(f"nothing on {HOST}:{port}")


def start_emulators() -> tuple[list[subprocess.Popen[bytes]], str, str]:
    from storage.emulators import azurite_command

    from astream.testing import free_port

    gport, aport = free_port(), free_port()
    gcs = subprocess.Popen(
        [sys.executable, "-m", "gcp_storage_emulator", "start", "--host", HOST, "--port", str(gport),
         "--in-memory", "--default-bucket", "bench", "-q"], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    command = azurite_command()
    if command is None:
        raise SystemExit("Azurite not found: run `make azurite` (needs npm)")
    azure = subprocess.Popen(
        [command, "--inMemoryPersistence", "--skipApiVersionCheck", "--loose", "--blobHost", HOST,
         "--blobPort", str(aport)], stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    _wait(gport)
    _wait(aport)
    return [gcs, azure], f"http://{HOST}:{gport}", f"http://{HOST}:{aport}"


def write_dataset(out: str, storage_options: dict[str, Any], size_mb: int, shard_mb: int) -> float:
    from astream import MDSWriter

    rng = np.random.default_rng(0)
    sample = 1 << 20
    t = time.perf_counter()
    with MDSWriter(out=out, columns={"x": f"ndarray:uint8:{sample}"}, size_limit=f"{shard_mb}mb",
                   storage_options=storage_options, max_concurrency=4) as writer:
        for _ in range(size_mb):
            writer.write({"x": rng.integers(0, 255, sample, dtype=np.uint8)})
    return time.perf_counter() - t


def shard_list(index_bytes: bytes) -> list[tuple[str, int]]:
    import json

    shards = json.loads(index_bytes)["shards"]
    return [(s["raw_data"]["basename"], int(s["raw_data"]["bytes"])) for s in shards]


async def bounded(jobs: list[Callable[[], Awaitable[None]]], concurrency: int) -> None:
    limit = asyncio.Semaphore(concurrency)

    async def one(job: Callable[[], Awaitable[None]]) -> None:
        async with limit:
            await job()

    await asyncio.gather(*(one(j) for j in jobs))


# -- the modes --------------------------------------------------------------------------------------
async def astream_pass(root: str, opts: dict[str, Any], shards: list[tuple[str, int]], dest: str, conc: int) -> None:
    from astream._storage import StorageOptions
    from astream._storage.registry import StoragePool, configure
    from astream._storage.sink import FileSink

    options = configure(root, opts, StorageOptions(max_connections=conc))
    async with StoragePool(options) as pool:
        storage = pool.get(root)

        def job(name: str, size: int) -> Callable[[], Awaitable[None]]:
            async def go() -> None:
                sink = FileSink(os.path.join(dest, name), fsync=False)
                await storage.fetch_into(f"{root}/{name}", sink, size=size)
                await sink.commit()

            return go

        await bounded([job(n, s) for n, s in shards], conc)


async def gcs_client_pass(api: str, bucket: str, prefix: str, shards: list[tuple[str, int]], dest: str, conc: int) -> None:
    import aiohttp
    from gcloud.aio.storage import Storage

    loop = asyncio.get_running_loop()
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=conc), auto_decompress=False) as session:
        client = Storage(session=session, api_root=api)  # type: ignore[arg-type]

        def job(name: str) -> Callable[[], Awaitable[None]]:
            async def go() -> None:
                stream = await client.download_stream(bucket, f"{prefix}/{name}")
                with open(os.path.join(dest, name), "wb") as fh:  # noqa: ASYNC230 - writes go to a thread
                    while chunk := await stream.read(1 << 20):
                        await loop.run_in_executor(None, fh.write, chunk)

            return go

        await bounded([job(n) for n, _ in shards], conc)


async def azure_client_pass(conn: str, container: str, prefix: str, shards: list[tuple[str, int]], dest: str,
                            conc: int) -> None:
    from azure.storage.blob.aio import BlobServiceClient

    async with BlobServiceClient.from_connection_string(conn) as service:

        def job(name: str) -> Callable[[], Awaitable[None]]:
            async def go() -> None:
                blob = service.get_blob_client(container, f"{prefix}/{name}")
                downloader = await blob.download_blob(max_concurrency=1)
                with open(os.path.join(dest, name), "wb") as fh:  # noqa: ASYNC230 - writes go to a thread
                    await downloader.readinto(fh)

            return go

        await bounded([job(n) for n, _ in shards], conc)


async def obstore_pass(store: Any, prefix: str, shards: list[tuple[str, int]], dest: str, conc: int) -> None:
    import obstore

    loop = asyncio.get_running_loop()

    def job(name: str) -> Callable[[], Awaitable[None]]:
        async def go() -> None:
            resp = await obstore.get_async(store, f"{prefix}/{name}")
            with open(os.path.join(dest, name), "wb") as fh:  # noqa: ASYNC230 - writes go to a thread
                async for chunk in resp.stream(min_chunk_size=1 << 20):
                    await loop.run_in_executor(None, fh.write, chunk)

        return go

    await bounded([job(n) for n, _ in shards], conc)


def run_mode(coro: Callable[[str], Awaitable[None]], work: Path, shards: list[tuple[str, int]]) -> float:
    from astream._storage.loop import run

    dest = tempfile.mkdtemp(dir=work)
    t = time.perf_counter()
    run(coro(dest))
    elapsed = time.perf_counter() - t
    got = sum(os.path.getsize(os.path.join(dest, n)) for n, _ in shards)
    assert got == sum(s for _, s in shards), (got, dest)
    shutil.rmtree(dest)
    return elapsed


def bench_remote(name: str, root: str, opts: dict[str, Any], args: argparse.Namespace, store: Any,
                 gcs_url: str, conn: str, work: Path) -> None:
    """Upload the dataset to one emulator, then time each mode's cold pass over it."""
    from astream._storage.loop import run
    from astream._storage.registry import StoragePool, configure

    upload = write_dataset(root, opts, args.size_mb, args.shard_mb)

    async def index() -> bytes:
        async with StoragePool(configure(root, opts)) as pool:
            return await pool.get(root).read_bytes(f"{root}/index.json")

    shards = shard_list(run(index()))
    total_mb = sum(s for _, s in shards) / 1e6
    conc = args.concurrency
    print(f"\n{name}: {len(shards)} shards, {total_mb:.0f} MB; MDSWriter upload {upload:.2f} s "
          f"({total_mb / upload:.0f} MB/s)")
    modes: dict[str, Callable[[str], Awaitable[None]]] = {"astream": lambda d: astream_pass(root, opts, shards, d, conc)}
    if name == "gcs":
        modes["client"] = lambda d: gcs_client_pass(gcs_url, "bench", "ds", shards, d, conc)
    else:
        modes["client"] = lambda d: azure_client_pass(conn, "bench", "ds", shards, d, conc)
    if store is not None:
        modes["obstore"] = lambda d: obstore_pass(store, "ds", shards, d, conc)
    times: dict[str, list[float]] = {m: [] for m in modes}
    for _ in range(args.runs):
        for mode, coro in list(modes.items()):
            try:
                times[mode].append(run_mode(coro, work, shards))
            except Exception as exc:  # obstore and gcp-storage-emulator disagree on headers
                print(f"  {mode}: cannot read from this emulator: {type(exc).__name__}: {str(exc).splitlines()[0]}")
                del modes[mode], times[mode]
    med = {m: statistics.median(t) for m, t in times.items()}
    for mode, t in times.items():
        print(f"  {mode:8s} median {med[mode]:6.2f} s  {total_mb / med[mode]:6.0f} MB/s   runs "
              + " ".join(f"{x:.2f}" for x in t))
    print(f"  astream / client rate: {med['client'] / med['astream']:.2f}x")
    if "obstore" in med:
        print(f"  obstore / astream rate: {med['astream'] / med['obstore']:.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size-mb", type=int, default=160)
    parser.add_argument("--shard-mb", type=int, default=8)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--work", default=None, help="scratch folder (default: a temp dir)")
    args = parser.parse_args()
    from storage.emulators import azurite_connection_string

    work = Path(args.work or tempfile.mkdtemp(prefix="astream-remote-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    procs, gcs_url, azure_url = start_emulators()
    try:
        conn = azurite_connection_string(azure_url)
        from azure.storage.blob import BlobServiceClient

        BlobServiceClient.from_connection_string(conn).create_container("bench")
        remotes: dict[str, tuple[str, dict[str, Any]]] = {
            "gcs": ("gs://bench/ds", {"endpoint_url": gcs_url, "anonymous": True}),
            "azure": ("azure://bench/ds", {"connection_string": conn}),
        }
        try:
            import obstore.store as ostore

            os.environ["AZURITE_BLOB_STORAGE_URL"] = azure_url
            stores: dict[str, Any] = {
                "gcs": ostore.GCSStore("bench", base_url=gcs_url, skip_signature=True,
                                       client_options={"allow_http": True}),
                "azure": ostore.AzureStore("bench", use_emulator=True, client_options={"allow_http": True}),
            }
        except ImportError:
            stores = {}
        print(f"dataset: {args.size_mb} x 1 MiB samples, {args.shard_mb} MB shards, uncompressed; "
              f"concurrency {args.concurrency}; {args.runs} runs per mode, interleaved")
        for name, (root, opts) in remotes.items():
            bench_remote(name, root, opts, args, stores.get(name), gcs_url, conn, work)
    finally:
        for proc in procs:
            proc.terminate()
            proc.wait(10)


if __name__ == "__main__":
    main()
