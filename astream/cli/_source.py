"""Where a dataset is: a local directory or a remote URL, and reading its index.json."""

from __future__ import annotations

import os

from astream._format.index import INDEX_NAME, MAX_INDEX_BYTES, Index
from astream._format.names import check_split
from astream._storage.local import local_path_of
from astream._storage.loop import run
from astream._storage.registry import StoragePool, join_url, scheme_of
from astream._storage.sink import read_limited
from astream.cli._output import CommandError

__all__ = ["dataset_root", "is_local", "read_index"]


def is_local(location: str) -> bool:
    """Whether ``location`` is a plain path or a ``file://`` URL."""
    return scheme_of(location) in ("", "file")


def dataset_root(location: str, split: str | None) -> str:
    """The URL (or path) of the folder holding the index.json of ``location``/``split``."""
    check_split(split)
    return join_url(location, split)


def read_index(location: str, split: str | None = None) -> Index:
    """Parse the index.json of a local dataset or fetch and parse a remote one.

    Raises:
        CommandError: a local path that does not exist, or has no index.json.
        IndexFormatError: the index is malformed.
        DownloadError: a remote index could not be fetched (RemoteNotFoundError: none there).
    """
    root = dataset_root(location, split)
    if is_local(location):
        path = local_path_of(root)
        if not os.path.isdir(path):
            raise CommandError(f"{path}: no such directory")
        index_path = os.path.join(path, INDEX_NAME)
        if not os.path.exists(index_path):
            raise CommandError(f"{path}: no {INDEX_NAME} here; {_split_hint(path)}")
        return Index.load(index_path)
    url = join_url(root, INDEX_NAME)
    return run(_fetch_index(url))


async def _fetch_index(url: str) -> Index:
    async with StoragePool() as pool:
        data = await read_limited(pool.get(url), url, MAX_INDEX_BYTES)
    return Index.from_bytes(data, url)


def _split_hint(path: str) -> str:
    # A dataset with splits keeps one index.json per sub-folder: point at them.
    splits = sorted(d for d in os.listdir(path) if os.path.isfile(os.path.join(path, d, INDEX_NAME)))
    if splits:
        return f"it has the splits {', '.join(splits)}: pass --split NAME"
    return "is this an MDS dataset directory?"
