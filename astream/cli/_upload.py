"""Sending a converted dataset to a remote (``astream convert -o s3://bucket/ds``).

The conversion runs into a local staging folder as usual; then the shard files go up,
several at once, and index.json last, so a reader never finds an index whose shards
are not all there yet.
"""

from __future__ import annotations

import asyncio
import os
from typing import Any

from astream._format.index import INDEX_NAME, Index
from astream._storage.registry import StoragePool, join_url

__all__ = ["remote_has_index", "upload_dataset"]


async def remote_has_index(remote: str) -> bool:
    """Whether ``remote`` already holds a dataset (an index.json)."""
    url = join_url(remote, INDEX_NAME)
    async with StoragePool() as pool:
        return await pool.get(url).exists(url)


async def upload_dataset(local: str, remote: str, jobs: int, bar: Any) -> None:
    """Upload the dataset in ``local`` to ``remote``: shards first, then index.json.

    Raises:
        UploadError: a file could not be uploaded (after retries).
    """
    index = Index.load(os.path.join(local, INDEX_NAME))
    gate = asyncio.Semaphore(jobs)
    async with StoragePool() as pool:

        async def put(name: str) -> None:
            async with gate:
                url = join_url(remote, name)
                await pool.get(url).put(os.path.join(local, name), url)
                bar.update(1)

        await asyncio.gather(*(put(s.stored.basename) for s in index.shards))
        await put(INDEX_NAME)
