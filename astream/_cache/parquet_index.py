"""The index of a Parquet stream: from a written index, or from the files' footers.

``astream index`` writes :data:`PARQUET_INDEX` next to the data: each file's name, size,
etag and footer bytes. A stream reads that when the remote has one (an ``http(s)://``
remote needs it: a web server cannot list), else lists the folder or prefix and reads
each file's footer with ranged reads of its end (its size first, so no suffix range is
ever asked for). Footers already in the local cache's copy are reused when the file's
size and etag are unchanged. The row-group index built from the footers is written to
the local cache as ``index.json``, as an MDS stream's is (the node agent is handed the
dataset's parsed index instead, see :mod:`astream._node.provider`).
"""

from __future__ import annotations

import asyncio
import base64
import json
import os
from collections.abc import Sequence

from astream._format.files import save_rebuildable
from astream._format.index import INDEX_NAME, MAX_INDEX_BYTES, Index
from astream._format.parquet.build import build_index
from astream._format.parquet.footer import TAIL_GUESS, FileFooter, footer_start
from astream._storage.base import ObjectInfo, Storage
from astream._storage.registry import StoragePool, join_url
from astream._storage.sink import read_limited
from astream.errors import IndexFormatError, RemoteNotFoundError, UsageError

__all__ = ["PARQUET_INDEX", "SUFFIXES", "dump_footers", "load_footers", "load_parquet_index", "scan_footers"]

PARQUET_INDEX = "index.parquet.json"
SUFFIXES = (".parquet", ".pq")
# Footers read at once while scanning a folder.
_CONCURRENT = 16


def dump_footers(footers: Sequence[FileFooter]) -> bytes:
    """The bytes of :data:`PARQUET_INDEX` for these files (sorted by name)."""
    files = [{"name": f.name, "bytes": f.size, "etag": f.etag, "footer": base64.b64encode(f.footer).decode()}
             for f in sorted(footers, key=lambda f: f.name)]
    return json.dumps({"version": 1, "format": "parquet", "files": files}, sort_keys=True).encode()


def load_footers(data: bytes, source: str) -> list[FileFooter]:
    """Parse :data:`PARQUET_INDEX` bytes.

    Raises:
        IndexFormatError: not such an index (names the field).
    """
    try:
        obj = json.loads(data)
        if not isinstance(obj, dict) or obj.get("version") != 1 or obj.get("format") != "parquet":
            raise ValueError("not a version 1 Parquet index")
        out = []
        for f in obj["files"]:
            etag = f["etag"]
            if not isinstance(f["name"], str) or not isinstance(f["bytes"], int) or not (etag is None or
                                                                                       isinstance(etag, str)):
                raise ValueError(f"bad file entry {f!r}")
            out.append(FileFooter(f["name"], f["bytes"], etag, base64.b64decode(f["footer"], validate=True)))
        return out
    except (ValueError, KeyError, TypeError) as exc:
        raise IndexFormatError(f"{source}: {exc}; rebuild it with `astream index`") from exc


async def read_footer(storage: Storage, url: str, name: str, info: ObjectInfo) -> FileFooter:
    """The footer of the Parquet file at ``url`` of ``info.size`` bytes, by ranged reads.

    Raises:
        ShardFormatError: not a Parquet file, or its footer is longer than the file.
    """
    size = info.size
    if size < 12:
        footer_start(url, size, b"")  # raises: too short for a Parquet file
    begin = max(0, size - TAIL_GUESS)
    tail = await storage.read_range(url, begin, size)
    start = footer_start(url, size, tail)
    if start < begin:
        tail = await storage.read_range(url, start, begin) + tail
        begin = start
    return FileFooter(name, size, info.etag, tail[start - begin :])


async def scan_footers(storage: Storage, root: str, known: Sequence[FileFooter] = ()) -> list[FileFooter]:
    """List the Parquet files under ``root`` and read their footers (reusing ``known`` ones
    whose size and etag are unchanged).

    Raises:
        UsageError: the remote cannot list (then write an index with ``astream index``).
    """
    try:
        objects = await storage.list_objects(root)
    except UsageError as exc:
        raise UsageError(
            f"{root}: cannot list its Parquet files ({exc}); write an index next to the data with "
            f"`astream index PATH_OR_URL` (from a place that can list it), which this remote then serves"
        ) from exc
    cached = {(f.name, f.size, f.etag): f for f in known}
    files = [(name, info) for name, info in objects if name.endswith(SUFFIXES)]
    slots = asyncio.Semaphore(_CONCURRENT)

    async def one(name: str, info: ObjectInfo) -> FileFooter:
        hit = cached.get((name, info.size, info.etag))
        if hit is not None:
            return hit
        async with slots:
            return await read_footer(storage, join_url(root, name), name, info)

    return list(await asyncio.gather(*(one(n, i) for n, i in files)))


async def load_parquet_index(
    local: str, remote: str, split: str | None, columns: Sequence[str] | None, pool: StoragePool,
) -> Index:
    """The row-group index of the Parquet stream at ``remote`` (``split`` below it), written to
    ``<local>/[split/]index.json`` too.

    Raises:
        IndexFormatError: no files, schemas that differ, a bad written index.
        ShardFormatError: a file that is not Parquet or whose footer points past its end.
        ConfigError: a column of ``columns`` that does not exist.
        UsageError: the remote cannot be listed and has no written index.
    """
    root = join_url(remote, split)
    local_root = os.path.join(local, split) if split else local
    storage = pool.get(root)
    loop = asyncio.get_running_loop()
    written = join_url(root, PARQUET_INDEX)
    cached_path = os.path.join(local_root, PARQUET_INDEX)

    async def read_written() -> bytes | None:
        try:
            return await read_limited(storage, written, MAX_INDEX_BYTES)
        except RemoteNotFoundError:
            return None

    # Both at once: each is a round trip (or a thread hop), and a resume waits for them.
    data, known = await asyncio.gather(read_written(), loop.run_in_executor(None, _read_cached, cached_path))
    footers = load_footers(data, written) if data is not None else await scan_footers(storage, root, known)
    index_path = os.path.join(local_root, INDEX_NAME)

    def build_and_save() -> Index:  # one thread hop for the pure work and both writes
        if data is None:
            save_rebuildable(cached_path, dump_footers(footers))
        index = build_index(footers, columns, root)
        save_rebuildable(index_path, index.dumps())
        return index

    index = await loop.run_in_executor(None, build_and_save)
    return Index(index.shards, index_path)


def _read_cached(path: str) -> list[FileFooter]:
    try:
        with open(path, "rb") as fh:
            return load_footers(fh.read(), path)
    except (OSError, IndexFormatError):
        return []  # a cache only: rebuilt from the files
