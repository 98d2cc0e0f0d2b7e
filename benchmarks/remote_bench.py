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
   - ``mosaic`` (gs:// only, when ``ASTREAM_PEER_PYTHON`` names an interpreter with
     mosaicml-streaming): its ``GCSDownloader`` (google-cloud-storage
     ``download_to_filename``) on ``--concurrency`` threads, in that interpreter, pointed at
     the emulator with ``STORAGE_EMULATOR_HOST``. It refuses to start without Google
     credentials (``google.auth.default()`` before the client is made, even for an
     emulator), so the bench hands it a service-account file whose ``token_uri`` is a
     loopback token server of its own; the emulator ignores the token.

4. Prints the median wall time, MB/s and CPU seconds (this process and its threads) of
   each mode, and the ratios astream / client (target >= 0.9x) and obstore / astream.
   ``--pin-client CPU`` pins the benchmark process (not the emulators) to one CPU, which
   shows how much of a mode's speed comes from using more than one core.

Usage::

    ASTREAM_PEER_PYTHON=<peer venv>/bin/python .venv/bin/python benchmarks/remote_bench.py --size-mb 160 --runs 5
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import resource
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
from peer_stub import stub_streaming_vision

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))
HOST = "127.0.0.1"
PEER_PYTHON = os.environ.get("ASTREAM_PEER_PYTHON")


def cpu_now() -> float:
    """CPU seconds of this process, every thread included (obstore's runtime, write threads)."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


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
                   storage_options=storage_options, max_workers=4) as writer:
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


def mosaic_worker(root: str, names: list[str], dest: str, conc: int) -> None:
    """In the peer interpreter: download every shard with mosaicml-streaming's GCS downloader."""
    from concurrent.futures import ThreadPoolExecutor

    stub_streaming_vision()
    from streaming.base.storage.download import DOWNLOADER_MAPPINGS  # type: ignore[import-not-found]

    downloader = DOWNLOADER_MAPPINGS["gs"]()  # one per stream, shared by its download threads, as StreamingDataset does
    downloader.download(f"{root}/{names[0]}", os.path.join(dest, "warm"))  # credentials + client, untimed
    cpu0, t = cpu_now(), time.perf_counter()
    with ThreadPoolExecutor(conc) as pool:
        list(pool.map(lambda n: downloader.download(f"{root}/{n}", os.path.join(dest, n)), names))
    print(json.dumps({"wall_s": time.perf_counter() - t, "cpu_s": cpu_now() - cpu0}))


class TokenServer:
    """A loopback OAuth endpoint and a service-account file naming it (for the peer's google-auth)."""

    def __init__(self, work: Path) -> None:
        from aiohttp import web
        from cryptography.hazmat.primitives import serialization
        from cryptography.hazmat.primitives.asymmetric import rsa

        from astream._storage.loop import LoopThread
        from astream.testing import free_port

        async def token(request: web.Request) -> web.Response:
            return web.json_response({"access_token": "bench", "expires_in": 3600, "token_type": "Bearer"})

        self.port = free_port()

        async def start() -> web.AppRunner:
            app = web.Application()
            app.router.add_post("/token", token)
            runner = web.AppRunner(app, access_log=None, handle_signals=False)
            await runner.setup()
            await web.TCPSite(runner, HOST, self.port).start()
            return runner

        self.thread = LoopThread("bench-token")
        self.runner = self.thread.call(start())
        key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
        pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                serialization.NoEncryption()).decode()
        self.file = work / "bench-sa.json"
        self.file.write_text(json.dumps({
            "type": "service_account", "project_id": "bench", "private_key_id": "k", "private_key": pem,
            "client_email": "bench@bench.iam.gserviceaccount.com", "client_id": "1",
            "token_uri": f"http://{HOST}:{self.port}/token"}))

    def close(self) -> None:
        self.thread.call(self.runner.cleanup())
        self.thread.close()


def mosaic_pass(
    gcs_url: str, shards: list[tuple[str, int]], dest: str, conc: int, token: TokenServer
) -> tuple[float, float]:
    assert PEER_PYTHON is not None
    env = {**os.environ, "STORAGE_EMULATOR_HOST": gcs_url, "GOOGLE_APPLICATION_CREDENTIALS": str(token.file)}
    env.pop("GCS_KEY", None)
    out = subprocess.run(
        [PEER_PYTHON, __file__, "--mosaic-worker", "gs://bench/ds", dest, str(conc), *(n for n, _ in shards)],
        env=env, check=True, capture_output=True, text=True, timeout=600,
    )
    result = json.loads(out.stdout.strip().splitlines()[-1])
    os.remove(os.path.join(dest, "warm"))
    return float(result["wall_s"]), float(result["cpu_s"])


def run_mode(coro: Callable[[str], Any], work: Path, shards: list[tuple[str, int]]) -> tuple[float, float]:
    """One cold pass into an empty folder; returns (wall seconds, CPU seconds)."""
    from astream._storage.loop import run

    dest = tempfile.mkdtemp(dir=work)
    cpu0, t = cpu_now(), time.perf_counter()
    result = coro(dest)
    if asyncio.iscoroutine(result):
        run(result)
        elapsed, cpu = time.perf_counter() - t, cpu_now() - cpu0
    else:
        elapsed, cpu = result  # a subprocess timed itself
    got = sum(os.path.getsize(os.path.join(dest, n)) for n, _ in shards)
    assert got == sum(s for _, s in shards), (got, dest)
    shutil.rmtree(dest)
    return elapsed, cpu


def bench_remote(name: str, root: str, opts: dict[str, Any], args: argparse.Namespace, store: Any,
                 gcs_url: str, conn: str, work: Path, token: TokenServer | None) -> None:
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
    modes: dict[str, Callable[[str], Any]] = {"astream": lambda d: astream_pass(root, opts, shards, d, conc)}
    if name == "gcs":
        modes["client"] = lambda d: gcs_client_pass(gcs_url, "bench", "ds", shards, d, conc)
        if token is not None:
            modes["mosaic"] = lambda d: mosaic_pass(gcs_url, shards, d, conc, token)
    else:
        modes["client"] = lambda d: azure_client_pass(conn, "bench", "ds", shards, d, conc)
    if store is not None:
        modes["obstore"] = lambda d: obstore_pass(store, "ds", shards, d, conc)
    times: dict[str, list[float]] = {m: [] for m in modes}
    cpus: dict[str, list[float]] = {m: [] for m in modes}
    for _ in range(args.runs):
        for mode, coro in list(modes.items()):
            try:
                wall, cpu = run_mode(coro, work, shards)
            except Exception as exc:  # obstore and gcp-storage-emulator disagree on headers
                stderr = getattr(exc, "stderr", None)  # the peer's traceback ends with its error
                detail = stderr.strip().splitlines()[-1] if stderr else str(exc).splitlines()[0]
                print(f"  {mode}: cannot read from this emulator: {type(exc).__name__}: {detail}")
                del modes[mode], times[mode], cpus[mode]
                continue
            times[mode].append(wall)
            cpus[mode].append(cpu)
    med = {m: statistics.median(t) for m, t in times.items()}
    for mode, t in times.items():
        print(f"  {mode:8s} median {med[mode]:6.2f} s  {total_mb / med[mode]:6.0f} MB/s  "
              f"CPU {statistics.median(cpus[mode]):5.2f} s   runs " + " ".join(f"{x:.2f}" for x in t))
    print(f"  astream / client rate: {med['client'] / med['astream']:.2f}x")
    if "obstore" in med:
        print(f"  obstore / astream rate: {med['astream'] / med['obstore']:.2f}x")
    if "mosaic" in med:
        print(f"  astream / mosaicml-streaming rate: {med['mosaic'] / med['astream']:.2f}x")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--size-mb", type=int, default=160)
    parser.add_argument("--shard-mb", type=int, default=8)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--concurrency", type=int, default=8)
    parser.add_argument("--work", default=None, help="scratch folder (default: a temp dir)")
    parser.add_argument("--pin-client", type=int, default=None, metavar="CPU",
                        help="pin this process (not the emulators) to one CPU once they are started")
    if len(sys.argv) > 1 and sys.argv[1] == "--mosaic-worker":
        root, dest, conc, *names = sys.argv[2:]
        mosaic_worker(root, names, dest, int(conc))
        return
    args = parser.parse_args()
    from storage.emulators import azurite_connection_string

    work = Path(args.work or tempfile.mkdtemp(prefix="astream-remote-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    procs, gcs_url, azure_url = start_emulators()
    token = TokenServer(work) if PEER_PYTHON else None
    if args.pin_client is not None:
        os.sched_setaffinity(0, {args.pin_client})  # threads made from now on inherit it
        print(f"benchmark process pinned to CPU {args.pin_client} (emulators unpinned)")
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
            bench_remote(name, root, opts, args, stores.get(name), gcs_url, conn, work, token)
    finally:
        if token is not None:
            token.close()
        for proc in procs:
            proc.terminate()
            proc.wait(10)


if __name__ == "__main__":
    main()
