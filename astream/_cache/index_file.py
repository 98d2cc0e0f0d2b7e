"""Getting a dataset's index.json: from the remote into the local cache, then read through
the node's binary index (:mod:`astream._cache.node_index`: built by the node's first
process, mapped by the others).

The download goes to a temporary name beside ``<local>/[split/]index.json`` and is
renamed into place, so a crash never leaves a truncated index that a later run trusts.
"""

from __future__ import annotations

import asyncio
import contextlib
import errno
import os
import warnings

import xxhash

from astream._cache.node_index import attach_index, content_hash
from astream._cache.origin import private_index_folder
from astream._format.index import INDEX_NAME, MAX_INDEX_BYTES, Index, ShardInfo
from astream._storage.base import Storage
from astream._storage.local import local_path_of
from astream._storage.registry import StoragePool, join_url, scheme_of
from astream.errors import AstreamError, CacheError, CacheWarning, ConfigError, DownloadError

__all__ = ["load_index", "node_index"]


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

    A remote that cannot be read (gone, or this machine offline) while ``local`` holds a
    copy of its index.json (left by a run of that remote: a folder is the cache of one
    remote, see :mod:`astream._cache.origin`) reads that copy, with a ``CacheWarning``, as
    MosaicML does; so does a read-only ``local`` that holds one.

    Raises:
        IndexFormatError: the index is malformed.
        RemoteNotFoundError: the remote has no index.json (and ``local`` has no copy).
        DownloadError: it could not be downloaded (and ``local`` has no copy).
        CacheError: it cannot be written into ``local`` (full, or read-only without a copy).
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
            before = await loop.run_in_executor(None, _keep_before, local_index) if have_local else None
            fetched = False
            try:
                await _fetch(remote_index, local_index, storage, pool)
                fetched = True
            except DownloadError as exc:
                if not have_local:
                    raise
                # Offline, or the remote is gone: the copy a run of this remote left is read,
                # as MosaicML reads it (the folder is this remote's: see astream._cache.origin).
                warnings.warn(f"{remote_index} cannot be read ({exc}); reading the copy of the dataset in "
                              f"{local_root} instead", CacheWarning, stacklevel=2)
            except AstreamError:
                raise
            except OSError as exc:
                _local_refused(local_index, have_local, exc)
            finally:
                if before is not None and not fetched:
                    before.drop()
            if fetched and before is not None:  # over the cache's copy: what changed is stale
                return await loop.run_in_executor(None, _forget_changed, local_root, local_index, before)
    return await loop.run_in_executor(None, node_index, local_index, None)


def node_index(local_index: str, known_hash: str | None = None) -> Index:
    """The index at ``local_index`` through the node's binary form (:mod:`astream._cache.node_index`),
    kept in the user's private cache (``<cache base>/indexes``): never in the dataset's
    folder (read in place, it is the user's data) nor in a cache folder (whose files are
    the remote's and astream's few records). Where it cannot be written (no space, no such
    folder), the JSON is parsed here as it always was.

    Raises:
        IndexFormatError: the index is missing or malformed.
    """
    try:
        return attach_index(local_index, private_index_folder(), known_hash)
    except (OSError, ConfigError):
        return Index.load(local_index)


class _Before:
    """The cache's copy of index.json before a fetch replaces it: a second name (hard link)
    for its bytes, or, where no link can be made, the bytes themselves."""

    def __init__(self, local_index: str) -> None:
        self.link: str | None = f"{local_index}.{os.getpid()}.{id(self):x}.before"
        self.data: bytes | None = None
        try:
            os.link(local_index, self.link)
        except OSError:
            self.link = None
            self.data = _read_quietly(local_index)

    def digest(self) -> str | None:
        if self.link is not None:
            return content_hash(self.link)
        return None if self.data is None else xxhash.xxh3_64_hexdigest(self.data)

    def read(self) -> bytes | None:
        if self.link is not None:
            return _read_quietly(self.link)
        return self.data

    def drop(self) -> None:
        if self.link is not None:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(self.link)
        self.data = None


def _keep_before(local_index: str) -> _Before:
    return _Before(local_index)


def _read_quietly(path: str) -> bytes | None:
    try:
        with open(path, "rb") as fh:
            return fh.read(MAX_INDEX_BYTES + 1)
    except OSError:
        return None


def _forget_changed(local_root: str, local_index: str, before: _Before) -> Index:
    """The index just fetched over ``before`` (the cache's copy); the cached files of every
    shard whose entry changed (size or digest: the remote's data was rewritten) are removed,
    so none is served by its name and size under an index that no longer describes it.

    An unchanged index (every start of a run that downloads it: the usual case) is compared
    by digests, read in chunks, and then mapped: no process holds its JSON."""
    try:
        now = content_hash(local_index)
        if before.digest() == now:
            return node_index(local_index, now)
        old_data = before.read()
    finally:
        before.drop()
    index = node_index(local_index, now)
    try:
        old = {} if old_data is None else {s.raw_data.basename: s
                                           for s in Index.from_bytes(old_data, local_index).shards}
    except AstreamError:
        old = {}  # a copy that does not parse describes nothing: the scan's size check decides
    del old_data
    for shard in index.shards:
        was = old.get(shard.raw_data.basename)
        if was is None or _same_entry(was, shard):
            continue
        for info in (was.raw_data, was.zip_data, was.raw_meta, was.zip_meta):
            if info is not None:
                with contextlib.suppress(FileNotFoundError):
                    os.unlink(os.path.join(local_root, *info.basename.split("/")))
    return index


def _same_entry(a: ShardInfo, b: ShardInfo) -> bool:
    return all((x is None and y is None) or (x is not None and y is not None and x.basename == y.basename
                                              and x.bytes == y.bytes and x.hashes == y.hashes)
               for x, y in ((a.raw_data, b.raw_data), (a.zip_data, b.zip_data), (a.raw_meta, b.raw_meta),
                            (a.zip_meta, b.zip_meta)))


async def _fetch(url: str, local_index: str, storage: Storage | None, pool: StoragePool | None) -> None:
    # Refused as it arrives past the cap: nothing of it stays in the cache.
    if storage is not None:
        await storage.fetch(url, local_index, limit=MAX_INDEX_BYTES)
    else:
        async with StoragePool() if pool is None else _borrow(pool) as p:
            await p.get(url).fetch(url, local_index, limit=MAX_INDEX_BYTES)


def _local_refused(local_index: str, have_local: bool, exc: OSError) -> None:
    """The index could not be written into ``local`` (issue 32, finding 13): a read-only
    copy of the dataset is read as it is; anything else is a :class:`CacheError`."""
    if have_local and exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
        return  # a complete read-only copy (its shards are checked against it as ever)
    where = os.path.dirname(local_index) or "."
    if exc.errno in (errno.ENOSPC, errno.EDQUOT, errno.EFBIG):
        fix = "free some space there (or a quota), or give another local"
    elif exc.errno in (errno.EROFS, errno.EACCES, errno.EPERM):
        fix = "it is read-only and holds no index.json: give a local astream may write, or copy the dataset there"
    else:
        fix = "give another local"
    raise CacheError(f"cannot write {local_index}, the index of the cache in {where}: {exc}; {fix}") from exc


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
