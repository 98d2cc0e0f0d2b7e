"""The local output folder of ``astream convert``, and what ``--overwrite`` may replace.

``--overwrite`` replaces a dataset, never a folder: it removes ``index.json``, the files
that index names, the conversion's own staging folder and the temporaries of those, and
refuses (before removing anything) a folder that holds anything else or holds an input,
so ``astream convert in.jsonl -o . --overwrite`` in the input's folder deletes nothing.
"""

from __future__ import annotations

import contextlib
import os
import re
import shutil
from collections.abc import Sequence

from astream._format.index import INDEX_NAME, Index
from astream._storage.local import local_path_of
from astream.cli._merge import PARTS_DIR
from astream.cli._output import CommandError
from astream.cli._source import is_local
from astream.errors import IndexFormatError

__all__ = ["prepare_out"]

# atomic_write's and the cache's temporaries: "<name>.<pid>.<hex>.tmp"
_TEMPORARY = re.compile(r"^(?P<name>.+)\.\d+\.[0-9a-f]{8}\.tmp$")


def prepare_out(out: str, overwrite: bool, inputs: Sequence[str]) -> None:
    """Make ``out`` (a local folder) an empty folder to write a dataset into.

    Raises:
        CommandError: ``out`` is a file, holds an input, or is not empty and either
            ``overwrite`` is off or it holds more than a dataset (exit code 2).
    """
    if os.path.isfile(out):
        raise CommandError(f"--out {out}: is a file, not a directory", 2)
    real = os.path.realpath(out)
    for given in inputs:
        if not is_local(given):
            continue
        path = os.path.realpath(local_path_of(given))
        if path == real or path.startswith(real.rstrip(os.sep) + os.sep):
            raise CommandError(f"--out {out}: holds the input {given}; write the dataset to another folder "
                               "(an output folder is replaced, its inputs would go with it)", 2)
    if os.path.isdir(out) and os.listdir(out):
        if not overwrite:
            raise CommandError(f"--out {out}: exists and is not empty; pass --overwrite to replace it", 2)
        _remove_dataset(out)
    os.makedirs(out, exist_ok=True)


def _remove_dataset(out: str) -> None:
    """Remove the dataset in ``out``, or raise if ``out`` holds anything else (nothing removed)."""
    try:
        index = Index.load(os.path.join(out, INDEX_NAME))
    except IndexFormatError as exc:
        raise CommandError(f"--out {out}: is not empty and holds no dataset astream can read ({exc}); "
                           "--overwrite replaces only a dataset: empty the folder or choose another", 2) from exc
    ours = {INDEX_NAME}
    for shard in index.shards:
        for info in (shard.raw_data, shard.zip_data, shard.raw_meta, shard.zip_meta):
            if info is not None:
                ours.add(os.path.normpath(info.basename))
    files: list[str] = []
    for folder, dirs, names in os.walk(out):
        rel = os.path.relpath(folder, out)
        if rel == PARTS_DIR:
            dirs.clear()  # the conversion's own staging folder: removed whole
            continue
        for name in names:
            path = os.path.normpath(os.path.join(rel, name))
            match = _TEMPORARY.match(path)
            if path not in ours and not (match and match.group("name") in ours):
                raise CommandError(f"--out {out}: holds {path!r}, which is not part of its dataset; --overwrite "
                                   "replaces only a dataset: move it away or choose another folder", 2)
            files.append(path)
    for path in sorted(files, key=lambda p: p == INDEX_NAME):  # index.json last: a half-removed folder says so
        os.unlink(os.path.join(out, path))
    shutil.rmtree(os.path.join(out, PARTS_DIR), ignore_errors=True)
    for folder in sorted({os.path.dirname(p) for p in files if os.path.dirname(p)}, key=len, reverse=True):
        with contextlib.suppress(OSError):  # a folder of shards ("3/shard.00000.mds"), if now empty
            os.rmdir(os.path.join(out, folder))
