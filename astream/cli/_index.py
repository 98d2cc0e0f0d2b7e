"""``astream index``: write the index of a folder of Parquet files next to the data.

The index (``index.parquet.json``) holds each file's name, size, etag and footer, read
by ranged reads of the file's end. A Parquet stream reads it instead of listing the
folder and reading every footer, which makes a start cheaper and is the only way for an
``http(s)://`` remote (a web server cannot list a folder): run the command where the
folder can be listed (a path, or ``s3://``), then serve or copy the folder with it.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from typing import Any

from astream._cache.parquet_index import PARQUET_INDEX, dump_footers, scan_footers
from astream._format.parquet.build import build_index
from astream._storage.loop import run as run_loop
from astream._storage.registry import StoragePool, join_url
from astream.cli._output import format_size

__all__ = ["add_parser", "run"]


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    """Declare ``astream index``."""
    p = sub.add_parser("index", parents=[common], help="write the index of a folder of Parquet files next to it",
                       description=f"Read the footers of the Parquet files under PATH_OR_URL (sorted by name; "
                                   f"ranged reads, nothing else of the files) and write {PARQUET_INDEX} there, "
                                   "so Stream(remote=..., format='parquet') starts without listing it "
                                   "(needed for http(s):// remotes).")
    p.add_argument("location", metavar="PATH_OR_URL", help="folder of Parquet files: a path, file:// or s3:// URL")
    p.add_argument("--split", help="sub-folder of it to index")
    p.set_defaults(func=run)


async def _index(root: str) -> tuple[int, int, int, int]:
    async with StoragePool() as pool:
        storage = pool.get(root)
        footers = await scan_footers(storage, root)
        index = build_index(footers, None, root)  # refuses differing schemas and bad footers now
        data = dump_footers(footers)
        target = join_url(root, PARQUET_INDEX)
        fd, tmp = tempfile.mkstemp(suffix=".json")
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
            await storage.put(tmp, target)
        finally:
            os.unlink(tmp)
        return len(footers), len(index.shards), index.num_samples, sum(f.size for f in footers)


def run(args: argparse.Namespace) -> int:
    root = join_url(args.location, args.split)
    files, groups, rows, size = run_loop(_index(root))
    if not getattr(args, "quiet", False):
        print(f"{join_url(root, PARQUET_INDEX)}: {files} files ({format_size(size)}), {groups} row groups, "
              f"{rows} rows")
    return 0
