"""Getting a dataset's index.json: from the remote into the local cache, then parsed.

The download goes to a temporary name beside ``<local>/[split/]index.json`` and is
renamed into place, so a crash never leaves a truncated index that a later run trusts.
"""

from __future__ import annotations

import asyncio
import os

from astream._format.index import INDEX_NAME, MAX_INDEX_BYTES, Index
from astream._storage.base import Storage
from astream._storage.local import local_path_of
from astream._storage.registry import StoragePool, join_url, scheme_of

__all__ = ["load_index"]


async def load_index(
    local: str,
    remote: str | None = None,
    split: str | None = None,
    *,
    storage: Storage | None = None,
    pool: StoragePool | None = None,
    download: bool = True,
) -> Index:
    """Fetch (unless local only) and parse the index.json of a dataset.

    Args:
        local: the local cache directory.
        remote: the remote root, or None for a local-only dataset.
        split: the sub-directory of both.
        storage: the backend to use (else one from ``pool``, else a temporary one).
        pool: a pool to take the backend from.
        download: fetch the index even when a local copy exists (MosaicML does, so a
            changed remote is noticed); False reuses a local copy if there is one.

    Raises:
        IndexFormatError: the index is malformed.
        RemoteNotFoundError: the remote has no index.json.
        DownloadError: it could not be downloaded.
    """
    local_root = os.path.join(local, split) if split else local
    local_index = os.path.join(local_root, INDEX_NAME)
    loop = asyncio.get_running_loop()
    if remote is not None:
        remote_index = join_url(remote, split, INDEX_NAME)
        same = scheme_of(remote) in ("", "file") and await loop.run_in_executor(
            None, _same_file, local_path_of(remote_index), local_index
        )
        have_local = await loop.run_in_executor(None, os.path.exists, local_index)
        if not same and (download or not have_local):
            # Refused as it arrives past the cap: nothing of it stays in the cache.
            if storage is not None:
                await storage.fetch(remote_index, local_index, limit=MAX_INDEX_BYTES)
            else:
                async with StoragePool() if pool is None else _borrow(pool) as p:
                    await p.get(remote_index).fetch(remote_index, local_index, limit=MAX_INDEX_BYTES)
    return await loop.run_in_executor(None, Index.load, local_index)


def _same_file(a: str, b: str) -> bool:
    return os.path.realpath(a) == os.path.realpath(b)


class _borrow:
    """Use a caller's pool without closing it."""

    def __init__(self, pool: StoragePool) -> None:
        self.pool = pool

    async def __aenter__(self) -> StoragePool:
        return self.pool

    async def __aexit__(self, *exc: object) -> None:
        return None
