"""``merge_index``: one ``index.json`` over the parts of a distributed conversion.

The merged index lists every part's shards in partition order, each base name prefixed by
its part folder (``part-00003/shard.00000.mds.zstd``), as MosaicML's merged indexes do; a
reader resolves those names against the dataset root, so mosaicml-streaming and astream
read the result as one dataset. It is built from what the driver already holds:

* the :class:`PartFragment` s the tasks returned (nothing is downloaded), or
* a dataset root alone, for recovery: the part indexes found there (listed locally, or
  probed part by part on a remote), or
* MosaicML's form ``merge_index(index_file_urls, out, keep_local, download_timeout)``.

The file is written atomically (a rename locally; a single PUT on a remote, which object
stores make visible whole), and only once every part is known: a gap in the partition
numbers or parts that disagree on their columns raise instead of writing a half index.
"""

from __future__ import annotations

import contextlib
import os
import posixpath
import re
import shutil
import tempfile
from collections.abc import Sequence
from typing import Any

from astream._format.files import atomic_write
from astream._format.index import INDEX_NAME, Index
from astream._storage.base import StorageOptions
from astream._storage.loop import run as run_loop
from astream._storage.registry import StoragePool, join_url, scheme_of
from astream._storage.retry import Timeouts
from astream.convert._part import STAGING_DIR, Out, PartFragment, fragment_of_index, part_name, split_out
from astream.errors import ConfigError, IndexFormatError, RemoteNotFoundError

__all__ = ["merge_fragments", "merge_index"]

_PART = re.compile(r"^part-(\d{5,})$")
_PROBE_WINDOW = 32
_CONFIG_KEYS = ("column_encodings", "column_names", "column_sizes", "compression", "format", "hashes")


def merge_fragments(fragments: Sequence[PartFragment]) -> Index:
    """The merged index of ``fragments`` (in partition order; a repeated partition once).

    Raises:
        ConfigError: no fragments, two attempts of one partition disagree, or the parts
            were written with different columns or compression.
    """
    if not fragments:
        raise ConfigError("merge_index got no parts to merge")
    by_id: dict[int, PartFragment] = {}
    for fragment in fragments:
        seen = by_id.get(fragment.partition_id)
        if seen is not None and seen.shards != fragment.shards:
            raise ConfigError(f"partition {fragment.partition_id} was written twice with different shards; "
                              "a partition's rows must be the same in every attempt (sort or checkpoint the input)")
        by_id[fragment.partition_id] = fragment
    entries: list[dict[str, Any]] = []
    reference: tuple[Any, ...] | None = None
    for pid in sorted(by_id):
        for shard in by_id[pid].shards:
            config = tuple(repr(shard.get(k)) for k in _CONFIG_KEYS)
            if reference is None:
                reference = config
            elif config != reference:
                raise ConfigError(f"{part_name(pid)} was written with other columns or compression than the parts "
                                  "before it; every partition must use the same settings")
            entry = dict(shard)
            for key in ("raw_data", "zip_data"):
                if entry.get(key) is not None:
                    entry[key] = {**entry[key], "basename": posixpath.join(part_name(pid), entry[key]["basename"])}
            entries.append(entry)
    return Index.from_json({"shards": entries, "version": 2})


def _roots(fragments: Sequence[PartFragment], out: Out | None) -> tuple[str | None, str | None]:
    if out is not None:
        return split_out(out)
    first = fragments[0]
    return first.local, first.remote


def _write(index: Index, local: str | None, remote: str | None, keep_local: bool = True) -> str:
    """Write ``index`` into the roots; returns where (the remote when there is one)."""
    data = index.dumps()
    if remote is None:
        assert local is not None
        os.makedirs(local, exist_ok=True)
        path = os.path.join(local, INDEX_NAME)
        atomic_write(path, data)
        # What killed attempts left staging (finished attempts cleaned up after themselves).
        shutil.rmtree(os.path.join(local, STAGING_DIR), ignore_errors=True)
        return path
    if local is not None and keep_local:
        os.makedirs(local, exist_ok=True)
        atomic_write(os.path.join(local, INDEX_NAME), data)
    url = join_url(remote, INDEX_NAME)
    with tempfile.TemporaryDirectory(prefix="astream-merge-") as scratch:
        path = os.path.join(scratch, INDEX_NAME)
        with open(path, "wb") as fh:
            fh.write(data)

        async def put() -> None:
            async with StoragePool() as pool:
                await pool.get(url).put(path, url)

        run_loop(put())
    return url


def _listed_parts(local: str) -> list[int]:
    try:
        names = os.listdir(local)
    except OSError as exc:
        raise ConfigError(f"merge_index: cannot list {local!r}: {exc}") from exc
    return sorted(int(m.group(1)) for m in map(_PART.match, names) if m)


def _folder_indexes(local: str) -> list[str]:
    """Every index.json below ``local`` but its own, sorted by path as MosaicML lists them."""
    root = os.path.abspath(local)
    found = []
    for here, folders, files in os.walk(root):
        folders[:] = [f for f in folders if f != STAGING_DIR]  # unfinished attempts of astream's own parts
        if here != root and INDEX_NAME in files:
            found.append(os.path.join(here, INDEX_NAME))
    return sorted(found)


async def _read_parts(root: str, ids: Sequence[int] | None, timeout: float) -> dict[int, Index]:
    """Part indexes under ``root``: the given ids, or probed window by window until none answer."""
    import asyncio

    options = StorageOptions(timeouts=Timeouts(download=timeout))
    found: dict[int, Index] = {}
    async with StoragePool(options) as pool:
        async def one(pid: int) -> None:
            url = join_url(root, part_name(pid), INDEX_NAME)
            with contextlib.suppress(RemoteNotFoundError):
                found[pid] = Index.from_bytes(await pool.get(url).read_bytes(url), url)

        if ids is not None:
            await asyncio.gather(*(one(i) for i in ids))
            return found
        start = 0
        while True:
            await asyncio.gather(*(one(i) for i in range(start, start + _PROBE_WINDOW)))
            if not any(start <= i < start + _PROBE_WINDOW for i in found):
                return found
            start += _PROBE_WINDOW


def _recover(out: Out, keep_local: bool, timeout: float) -> str:
    local, remote = split_out(out)
    if remote is None:
        assert local is not None
        ids = _listed_parts(local)
        if not ids:
            # MosaicML's own root form: sub-folders of any name, each an MDS dataset a
            # writer of a parallel conversion left there (its docs' Pool example).
            found = _folder_indexes(local)
            if found:
                return _from_index_urls(found, local, keep_local, timeout)
        indexes = run_loop(_read_parts(local, ids, timeout))
    else:
        indexes = run_loop(_read_parts(remote, None, timeout))
    if not indexes:
        # A local root is also searched for MosaicML's sub-folders; a remote one is probed
        # for parts only (listing a bucket is not part of the storage protocol).
        what = "part-NNNNN/index.json" if remote is not None else "part-NNNNN/index.json nor any sub-folder's index.json"
        raise IndexFormatError(f"merge_index: no {what} under {remote or local}; "
                               "did the conversion write any partition there?")
    missing = sorted(set(range(max(indexes) + 1)) - set(indexes))
    if missing:
        raise IndexFormatError(f"merge_index: parts {', '.join(part_name(i) for i in missing[:10])} of "
                               f"{remote or local} have no index.json (their tasks did not finish); "
                               "rerun those partitions before merging")
    fragments = [fragment_of_index(i, idx, local, remote) for i, idx in sorted(indexes.items())]
    return _write(merge_fragments(fragments), local, remote, keep_local)


def _from_index_urls(urls: Sequence[Any], out: Out, keep_local: bool, timeout: float) -> str:
    """MosaicML's form: a list of part index files (paths, URLs or (local, remote) pairs)."""
    local, remote = split_out(out)
    root = remote or local
    assert root is not None
    targets: list[str] = []
    for item in urls:
        if isinstance(item, tuple | list):
            here, there = (str(x) if x else "" for x in item)
            targets.append(here if here and os.path.exists(here) else there)
        else:
            targets.append(str(item))

    async def read_all() -> list[Index]:
        import asyncio

        options = StorageOptions(timeouts=Timeouts(download=timeout))
        async with StoragePool(options) as pool:
            return list(await asyncio.gather(*(_read(pool, t) for t in targets)))

    entries: list[dict[str, Any]] = []
    for target, index in zip(targets, run_loop(read_all()), strict=True):
        folder = _relative_folder(target, local, remote)
        for shard in index.shards:
            entry = shard.to_json()
            for key in ("raw_data", "zip_data"):
                if entry.get(key) is not None:
                    entry[key] = {**entry[key], "basename": posixpath.join(folder, entry[key]["basename"])}
            entries.append(entry)
    merged = Index.from_json({"shards": entries, "version": 2})
    return _write(merged, local, remote, keep_local)


async def _read(pool: StoragePool, target: str) -> Index:
    return Index.from_bytes(await pool.get(target).read_bytes(target), target)


def _relative_folder(target: str, local: str | None, remote: str | None) -> str:
    """The folder of ``target`` (a part's index.json) relative to the dataset root."""
    folder = posixpath.dirname(target.replace(os.sep, "/"))
    for root in (remote, local):
        if not root:
            continue
        base = (root if scheme_of(root) else os.path.abspath(root)).replace(os.sep, "/").rstrip("/")
        where = folder if scheme_of(folder) else os.path.abspath(folder).replace(os.sep, "/")
        if where.startswith(base + "/"):
            return where[len(base) + 1:]
    raise ConfigError(f"merge_index: {target} is not inside the output {remote or local}; the part indexes "
                      "must lie in folders of out")


def merge_index(
    parts: Sequence[PartFragment] | Sequence[Any] | Out,
    out: Out | None = None,
    keep_local: bool = True,
    download_timeout: float = 60,
) -> str:
    """Write the merged ``index.json`` of a distributed conversion; returns its path or URL.

    Args:
        parts: the :class:`PartFragment` s the tasks returned; or the dataset root
            (``out`` alone: the parts found there are merged, for recovery); or, as in
            MosaicML, a list of the parts' index.json paths/URLs (or ``(local, remote)``
            pairs) with ``out`` given.
        out: the dataset root; with fragments it defaults to the one they were written to.
        keep_local: with a ``(local, remote)`` out, also write the index locally.
        download_timeout: seconds per part index read (recovery and MosaicML's form only).

    Raises:
        ConfigError: nothing to merge, parts written with different settings, or an
            index file outside ``out``.
        IndexFormatError: recovery found no parts, or a gap in the partition numbers.
        StorageError: a part index could not be read or the index not written.
    """
    if isinstance(parts, str | os.PathLike | tuple) and (out is None or not isinstance(parts, tuple)):
        return _recover(parts if out is None else out, keep_local, download_timeout)
    items = list(parts)
    if items and all(isinstance(p, PartFragment) for p in items):
        local, remote = _roots(items, out)
        return _write(merge_fragments(items), local, remote, keep_local)
    if out is None:
        raise ConfigError("merge_index(index_file_urls, out): give out, the dataset root the indexes lie in")
    if not items:
        raise ConfigError("merge_index got no index files to merge")
    return _from_index_urls(items, out, keep_local, download_timeout)
