"""The index of a WebDataset stream: its tars' samples, from a written index or a scan.

``astream index`` writes :data:`WDS_INDEX` next to the tars (each tar's name, size, etag,
sample count and extensions). Without it, the folder or prefix is listed and each tar's
headers are scanned once: in place for a local folder, else through a copy in the local
cache, which stays there as the cached tar when the cache has no ``cache_limit`` (each tar
is then fetched once) and is removed otherwise. Scans already in the local cache's copy are reused
while a tar's size and etag are unchanged. The index is written to the local cache as
``index.json``, as an MDS stream's is (the node agent is handed the
dataset's parsed index instead, see :mod:`astream._node.provider`).
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import os
import warnings
from collections.abc import Sequence

from astream._cache.durability import BackgroundSync
from astream._cache.install import temp_name
from astream._format.files import save_rebuildable
from astream._format.index import INDEX_NAME, MAX_INDEX_BYTES, Index, ShardInfo
from astream._format.names import unsafe_name
from astream._format.webdataset import BIG_MEMBER, GZ_SUFFIXES, TAR_SUFFIXES, TarSummary, scan_tar, tar_entry
from astream._storage.base import Storage
from astream._storage.local import local_path_of
from astream._storage.registry import StoragePool, join_url, scheme_of
from astream._storage.sink import read_limited
from astream.errors import IndexFormatError, LayoutWarning, RemoteNotFoundError, UsageError

__all__ = ["WDS_INDEX", "build_wds_index", "dump_tars", "load_wds_index", "scan_tars"]

WDS_INDEX = "index.wds.json"
_CONCURRENT = 4

Entry = tuple[str, int, str | None, TarSummary]


def dump_tars(entries: Sequence[Entry]) -> bytes:
    files = [{"name": n, "bytes": size, "etag": etag, "samples": s.samples, "extensions": list(s.extensions),
              "largest": s.largest, "tar_bytes": s.tar_bytes} for n, size, etag, s in sorted(entries, key=lambda e: e[0])]
    return json.dumps({"version": 1, "format": "webdataset", "files": files}, sort_keys=True).encode()


def load_tars(data: bytes, source: str) -> list[Entry]:
    """The entries of an ``index.wds.json`` (names checked before anything joins them).

    Raises:
        IndexFormatError: malformed, a name that is not a safe relative path, or a gzip tar
            without its decompressed size (written by an older ``astream index``).
    """
    try:
        obj = json.loads(data)
        if not isinstance(obj, dict) or obj.get("version") != 1 or obj.get("format") != "webdataset":
            raise ValueError("not a version 1 WebDataset index")
        out: list[Entry] = []
        for f in obj["files"]:
            name, size = f["name"], int(f["bytes"])
            why = unsafe_name(name)
            if why is not None:
                raise ValueError(f"the name {name!r} {why}")
            tar_bytes = f.get("tar_bytes", None if name.endswith(GZ_SUFFIXES) else size)
            if isinstance(tar_bytes, bool) or not isinstance(tar_bytes, int) or tar_bytes < 0:
                raise ValueError(f"{name}: no valid tar_bytes ({tar_bytes!r}), the size it decompresses to")
            out.append((name, size, f["etag"], TarSummary(int(f["samples"]), tuple(f["extensions"]),
                                                           int(f["largest"]), tar_bytes)))
        return out
    except (ValueError, KeyError, TypeError, RecursionError) as exc:
        raise IndexFormatError(f"{source}: {exc}; rebuild it with `astream index`") from exc


def build_wds_index(entries: Sequence[Entry], where: str) -> Index:
    """The index whose shards are the tars of ``entries`` (sorted by name here).

    Raises:
        IndexFormatError: there are no tars.
    """
    entries = sorted(entries, key=lambda e: e[0])
    if not entries:
        raise IndexFormatError(f"{where}: no WebDataset tars ({', '.join('*' + s for s in TAR_SUFFIXES)}) found")
    columns = sorted({ext for *_, s in entries for ext in s.extensions})
    shards = [ShardInfo.from_json(tar_entry(n, size, etag, s, columns), i, where)
              for i, (n, size, etag, s) in enumerate(entries)]
    huge = [n for n, _, _, s in entries if s.largest > BIG_MEMBER]
    if huge:
        warnings.warn(f"{where}: {len(huge)} tar(s) hold members over {BIG_MEMBER >> 20} MB (first: {huge[0]}); "
                      "a shard is read whole, so a few huge samples make it slow to start and to shuffle. "
                      "Split such samples, or convert the data with `astream convert`", LayoutWarning, stacklevel=3)
    return Index(tuple(shards), where)


async def scan_tars(storage: Storage, root: str, scratch: str, known: Sequence[Entry] = (),
                    keep: bool = False) -> list[Entry]:
    """List the tars under ``root`` and scan their headers (``scratch``: a folder for copies).

    Args:
        keep: ``scratch`` is the stream's cache folder, and the copies stay there as the
            cached tars (the cache finds them and fetches nothing): each tar crosses the
            network once. They appear by rename of a complete file, fsynced behind a
            durability marker (:class:`~astream._cache.durability.BackgroundSync`), like
            the engine's own installs. Otherwise the copies are removed.

    Raises:
        UsageError: the remote cannot be listed (write an index with ``astream index``).
        ShardFormatError: a file named as a tar is not one.
    """
    try:
        objects = await storage.list_objects(root)
    except UsageError as exc:
        raise UsageError(f"{root}: cannot list its tars ({exc}); write an index next to the data with "
                         "`astream index PATH_OR_URL` (from a place that can list it)") from exc
    cached = {(n, size, etag): s for n, size, etag, s in known}
    loop = asyncio.get_running_loop()
    slots = asyncio.Semaphore(_CONCURRENT)
    local = scheme_of(root) in ("", "file")

    async def one(name: str, size: int, etag: str | None) -> Entry:
        hit = cached.get((name, size, etag))
        if hit is not None:
            return name, size, etag, hit
        url = join_url(root, name)
        async with slots:
            if local:
                return name, size, etag, await loop.run_in_executor(None, scan_tar, local_path_of(url), url)
            final = os.path.join(scratch, *name.split("/"))
            os.makedirs(os.path.dirname(final), exist_ok=True)
            # A name the cache's start-up sweep removes if this process dies before the end.
            tmp = temp_name(final) if keep else os.path.join(scratch, f".scan.{os.getpid()}.{os.urandom(4).hex()}.tar")
            try:
                await storage.fetch(url, tmp)
                summary = await loop.run_in_executor(None, scan_tar, tmp, url)
                if keep and _size(tmp) == size:
                    await sync.prepare()  # the marker is durable before the rename it covers
                    # The rename (a metadata update) and its fsync's submission with no await
                    # between: a cancellation never leaves a renamed file unsynced.
                    os.replace(tmp, final)
                    sync.submit(final)
                return name, size, etag, summary
            finally:
                await loop.run_in_executor(None, _remove, tmp)

    sync = BackgroundSync(scratch)
    try:
        # Every scan ends (a failed one too) before the marker is dropped: no rename after it.
        got = await asyncio.gather(*(one(n, i.size, i.etag) for n, i in objects if n.endswith(TAR_SUFFIXES)),
                                   return_exceptions=True)
    finally:
        await sync.drain()
        sync.close()
    for outcome in got:
        if isinstance(outcome, BaseException):
            raise outcome
    return [e for e in got if not isinstance(e, BaseException)]


async def load_wds_index(local: str, remote: str, split: str | None, pool: StoragePool,
                         keep_scans: bool = False) -> Index:
    """The index of the WebDataset stream at ``remote``, written to ``<local>/[split/]index.json`` too.

    Args:
        keep_scans: a remote tar fetched to scan its headers stays in the cache as the
            cached shard (for a cache without ``cache_limit``: copies kept before the
            engine runs would not be under its accounting).
    """
    root = join_url(remote, split)
    local_root = os.path.join(local, split) if split else local
    storage = pool.get(root)
    loop = asyncio.get_running_loop()
    written = join_url(root, WDS_INDEX)
    try:
        entries = load_tars(await read_limited(storage, written, MAX_INDEX_BYTES), written)
    except RemoteNotFoundError:
        cached_path = os.path.join(local_root, WDS_INDEX)
        known = await loop.run_in_executor(None, _read_cached, cached_path)
        entries = await scan_tars(storage, root, local_root, known, keep=keep_scans)
        await loop.run_in_executor(None, save_rebuildable, cached_path, dump_tars(entries))
    index = build_wds_index(entries, root)
    await loop.run_in_executor(None, save_rebuildable, os.path.join(local_root, INDEX_NAME), index.dumps())
    return Index(index.shards, os.path.join(local_root, INDEX_NAME))


def _read_cached(path: str) -> list[Entry]:
    try:
        with open(path, "rb") as fh:
            return load_tars(fh.read(), path)
    except (OSError, IndexFormatError):
        return []


def _size(path: str) -> int:
    try:
        return os.stat(path).st_size
    except OSError:
        return -1


def _remove(path: str) -> None:
    with contextlib.suppress(FileNotFoundError):
        os.unlink(path)
