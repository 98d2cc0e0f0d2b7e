"""``astream index``: write the index of a folder of Parquet files or WebDataset tars next to it.

For Parquet (``index.parquet.json``) it holds each file's name, size, etag and footer, read
by ranged reads of the file's end; for tars (``index.wds.json``) each tar's name, size,
etag, sample count and extensions, from one scan of its headers. A stream reads it
instead of listing the folder and reading every file, which makes a start cheaper and is
the only way for an ``http(s)://`` remote (a web server cannot list a folder): run the
command where the folder can be listed (a path, or ``s3://``), then serve or copy the
folder with it.
"""

from __future__ import annotations

import argparse
import os
import tempfile
from typing import Any

from astream._cache.parquet_index import PARQUET_INDEX, dump_footers, scan_footers
from astream._cache.parquet_index import SUFFIXES as PARQUET_SUFFIXES
from astream._cache.wds_index import WDS_INDEX, build_wds_index, dump_tars, scan_tars
from astream._format.names import check_split
from astream._format.parquet.build import build_index
from astream._format.webdataset import TAR_SUFFIXES
from astream._storage.loop import run as run_loop
from astream._storage.registry import StoragePool, join_url
from astream.cli._output import format_size
from astream.errors import UsageError

__all__ = ["add_parser", "run"]


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    """Declare ``astream index``."""
    p = sub.add_parser("index", parents=[common],
                       help="write the index of a folder of Parquet files or WebDataset tars next to it",
                       description=f"Read the footers of the Parquet files under PATH_OR_URL (sorted by name; "
                                   f"ranged reads, nothing else of the files) and write {PARQUET_INDEX} there, "
                                   f"or scan the headers of its tars and write {WDS_INDEX}, so a stream with "
                                   "format='parquet' or 'webdataset' starts without listing it (needed for "
                                   "http(s):// remotes).")
    p.add_argument("location", metavar="PATH_OR_URL", help="the folder: a path, file:// or s3:// URL")
    p.add_argument("--split", help="sub-folder of it to index")
    p.add_argument("--format", choices=("parquet", "webdataset"), default=None,
                   help="what to index (default: Parquet if the folder holds Parquet files, else tars)")
    p.set_defaults(func=run)


async def _index(root: str, fmt: str | None) -> tuple[str, int, int, int, int]:
    async with StoragePool() as pool:
        storage = pool.get(root)
        if fmt is None:
            try:
                names = [n for n, _ in await storage.list_objects(root)]
            except UsageError as exc:
                raise UsageError(f"{root}: cannot list its files ({exc}); index the folder where it can be "
                                 "listed (a path or s3://) and serve or copy it with the index") from exc
            fmt = "webdataset" if not any(n.endswith(PARQUET_SUFFIXES) for n in names) and any(
                n.endswith(TAR_SUFFIXES) for n in names) else "parquet"
        if fmt == "parquet":
            footers = await scan_footers(storage, root)
            index = build_index(footers, None, root)  # refuses differing schemas and bad footers now
            data, name, size = dump_footers(footers), PARQUET_INDEX, sum(f.size for f in footers)
        else:
            with tempfile.TemporaryDirectory() as scratch:
                tars = await scan_tars(storage, root, scratch)
            index = build_wds_index(tars, root)
            data, name, size = dump_tars(tars), WDS_INDEX, sum(t[1] for t in tars)
        target = join_url(root, name)
        fd, tmp = tempfile.mkstemp(suffix=".json")
        try:
            with os.fdopen(fd, "wb") as fh:
                fh.write(data)
            await storage.put(tmp, target)
        finally:
            os.unlink(tmp)
        return target, len({sh.source.file if sh.source else sh.raw_data.basename for sh in index.shards}), \
            len(index.shards), index.num_samples, size


def run(args: argparse.Namespace) -> int:
    check_split(args.split)
    root = join_url(args.location, args.split)
    target, files, shards, rows, size = run_loop(_index(root, args.format))
    if not getattr(args, "quiet", False):
        what = "row groups" if target.endswith(PARQUET_INDEX) else "tars"
        print(f"{target}: {files} files ({format_size(size)}), {shards} {what}, {rows} samples")
    return 0
