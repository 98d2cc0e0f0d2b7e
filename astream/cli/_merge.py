"""Joining the part datasets of a parallel ``convert`` into one flat dataset.

Each worker writes its part with its own :class:`MDSWriter` into a folder under
``<out>/.astream-parts/``. The parts are then moved up and renumbered in order
(``shard.00000.mds``, ``shard.00001.mds``, ...) under one index.json, so the result is
indistinguishable from a single writer's output (apart from where shards end) and every
MDS reader, old or new, reads it. Shard files carry no name inside, so renaming is
enough. index.json comes last: until it exists the output is not a dataset.
"""

from __future__ import annotations

import dataclasses
import os
import shutil

from astream._format.files import atomic_write, fsync_dir
from astream._format.index import INDEX_NAME, Index, ShardInfo

__all__ = ["PARTS_DIR", "merge_parts"]

PARTS_DIR = ".astream-parts"


def merge_parts(out: str, part_dirs: list[str]) -> Index:
    """Move the shards of ``part_dirs`` (in order) into ``out`` and write its index.json.

    Returns:
        The index written.
    """
    shards: list[ShardInfo] = []
    for folder in part_dirs:
        for shard in Index.load(os.path.join(folder, INDEX_NAME)).shards:
            number = len(shards)
            raw = dataclasses.replace(shard.raw_data, basename=f"shard.{number:05}.{shard.format}")
            zipped = None
            if shard.zip_data is not None:
                extension = shard.zip_data.basename.rsplit(".", 1)[-1]
                zipped = dataclasses.replace(shard.zip_data, basename=f"{raw.basename}.{extension}")
            renamed = dataclasses.replace(shard, index=number, raw_data=raw, zip_data=zipped)
            os.replace(os.path.join(folder, shard.stored.basename), os.path.join(out, renamed.stored.basename))
            shards.append(renamed)
    index = Index(tuple(shards), os.path.join(out, INDEX_NAME))
    fsync_dir(out)  # the renames are durable before the index that makes them reachable
    atomic_write(index.source, index.dumps())
    shutil.rmtree(os.path.join(out, PARTS_DIR), ignore_errors=True)
    return index
