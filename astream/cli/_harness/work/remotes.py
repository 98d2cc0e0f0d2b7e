"""Cold passes over a dataset in a cloud emulator: astream's ``StreamingDataset`` (one epoch
over an empty cache), or every shard downloaded to files by a client library (its own
streaming download, ``concurrency`` objects in flight) or obstore."""

from __future__ import annotations

import asyncio
import json
import os
import time
from collections.abc import Awaitable, Callable
from typing import Any

from . import tree_cpu_s

__all__ = ["astream_epoch", "client_pass"]


def astream_epoch(remote: str, local: str, storage_options: dict[str, Any], batch: int = 8) -> dict[str, Any]:
    """One epoch of ``Loader(StreamingDataset(remote=...))`` over an empty cache."""
    from astream import Loader, StreamingDataset

    start = time.perf_counter()
    ds = StreamingDataset(remote=remote, local=local, batch_size=batch, storage_options=storage_options)
    with Loader(ds, batch_size=batch) as loader:
        samples = sum(len(b["x"]) for b in loader)
    ds.close()
    return {"seconds": time.perf_counter() - start, "samples": samples, "cpu_s": tree_cpu_s()}


async def _bounded(jobs: list[Callable[[], Awaitable[None]]], concurrency: int) -> None:
    gate = asyncio.Semaphore(concurrency)

    async def one(job: Callable[[], Awaitable[None]]) -> None:
        async with gate:
            await job()

    await asyncio.gather(*(one(j) for j in jobs))


async def _gcs(api: str, bucket: str, prefix: str, dest: str, conc: int) -> None:
    import aiohttp
    from gcloud.aio.storage import Storage

    loop = asyncio.get_running_loop()
    async with aiohttp.ClientSession(connector=aiohttp.TCPConnector(limit=conc), auto_decompress=False) as session:
        client = Storage(session=session, api_root=api)  # type: ignore[arg-type]
        index = json.loads(await client.download(bucket, f"{prefix}/index.json"))

        def job(name: str) -> Callable[[], Awaitable[None]]:
            async def go() -> None:
                stream = await client.download_stream(bucket, f"{prefix}/{name}")
                with open(os.path.join(dest, name), "wb") as fh:  # noqa: ASYNC230 - writes go to a thread
                    while chunk := await stream.read(1 << 20):
                        await loop.run_in_executor(None, fh.write, chunk)

            return go

        await _bounded([job(s["raw_data"]["basename"]) for s in index["shards"]], conc)


async def _azure(conn: str, container: str, prefix: str, dest: str, conc: int) -> None:
    from azure.storage.blob.aio import BlobServiceClient

    async with BlobServiceClient.from_connection_string(conn) as service:
        index_blob = await service.get_blob_client(container, f"{prefix}/index.json").download_blob()
        index = json.loads(await index_blob.readall())

        def job(name: str) -> Callable[[], Awaitable[None]]:
            async def go() -> None:
                downloader = await service.get_blob_client(container, f"{prefix}/{name}").download_blob(
                    max_concurrency=1)
                with open(os.path.join(dest, name), "wb") as fh:  # noqa: ASYNC230 - writes go to a thread
                    await downloader.readinto(fh)

            return go

        await _bounded([job(s["raw_data"]["basename"]) for s in index["shards"]], conc)


async def _obstore(kind: str, endpoint: str, prefix: str, dest: str, conc: int) -> None:
    import obstore
    import obstore.store as ostore

    store: Any
    if kind == "gcs":
        store = ostore.GCSStore("bench", base_url=endpoint, skip_signature=True, client_options={"allow_http": True})
    else:
        os.environ["AZURITE_BLOB_STORAGE_URL"] = endpoint
        store = ostore.AzureStore("bench", use_emulator=True, client_options={"allow_http": True})
    index = json.loads(bytes(await (await obstore.get_async(store, f"{prefix}/index.json")).bytes_async()))
    loop = asyncio.get_running_loop()

    def job(name: str) -> Callable[[], Awaitable[None]]:
        async def go() -> None:
            resp = await obstore.get_async(store, f"{prefix}/{name}")
            with open(os.path.join(dest, name), "wb") as fh:  # noqa: ASYNC230 - writes go to a thread
                async for chunk in resp.stream(min_chunk_size=1 << 20):
                    await loop.run_in_executor(None, fh.write, chunk)

        return go

    await _bounded([job(s["raw_data"]["basename"]) for s in index["shards"]], conc)


def client_pass(client: str, kind: str, endpoint: str, dest: str, concurrency: int = 8) -> dict[str, Any]:
    """Every shard of ``bench/ds`` to files in ``dest`` by ``client`` (``library``: the
    emulator's own client library; ``obstore``), ``concurrency`` at a time."""
    start = time.perf_counter()
    if client == "obstore":
        coro = _obstore(kind, endpoint, "ds", dest, concurrency)
    elif kind == "gcs":
        coro = _gcs(endpoint, "bench", "ds", dest, concurrency)
    else:
        coro = _azure(endpoint, "bench", "ds", dest, concurrency)
    asyncio.run(coro)
    got = sum(os.path.getsize(os.path.join(dest, n)) for n in os.listdir(dest))
    return {"seconds": time.perf_counter() - start, "bytes": got, "cpu_s": tree_cpu_s()}
