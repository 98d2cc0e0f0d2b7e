"""The node's binary index: built once from ``index.json`` in the cache, mapped by every
process (:mod:`astream._format.binindex` is the format).

``<root>/index.json`` gets a file named by a digest of its real path in a folder of the
user's private cache (the dataset reads it so, :func:`~astream._cache.index_file.node_index`;
the user's dataset folder and the cache folders are never written), or
``<root>/.index.json.astream-v2.bin`` beside it where no folder is given (:func:`binary_path`).
A process:

1. stats ``index.json`` and opens the binary file (magic, version, length and checksum
   checked: :meth:`BinaryIndex.open`);
2. uses it when its stamp (size and modification time of the ``index.json`` it was built
   from) matches, or, when only the time differs (a re-download of the same index), when
   the xxh3-64 of ``index.json``'s bytes matches the one it recorded;
3. else, under an exclusive ``flock`` of ``<bin>.lock`` (the first process of the node
   builds, the others wait and then find it built), parses ``index.json`` one entry at a
   time (:mod:`astream._format.index_stream`) with the same validator as ever, writes the
   columns to a temporary file and renames it into place.

Never trusted: a binary file that is truncated, corrupt (its checksum) or of another version
is rebuilt, one built from another ``index.json`` (the stamp) too; and an ``index.json`` that
does not validate raises the :class:`IndexFormatError` its JSON reader raises. The file is not
fsynced: every open checks its checksum, so a power cut that tears it costs a rebuild, never a
wrong index (the fsync of a file per stream was most of a 10^4-stream build).
"""

from __future__ import annotations

import contextlib
import fcntl
import os
import tempfile
from typing import Any, BinaryIO

import xxhash

from astream._format.binindex import FORMAT_VERSION, BinaryIndex, ShardTable, write_binary_index
from astream._format.index import MAX_INDEX_BYTES, Index, too_large
from astream._format.index_stream import Unusual, stream_shards
from astream.errors import IndexFormatError

__all__ = ["attach_index", "binary_path", "content_hash"]

_CHUNK = 1 << 24


def binary_path(index_json: str, folder: str | None = None) -> str:
    """Where the binary form of ``index_json`` lives: beside it (in the cache), or in
    ``folder`` under a digest of its real path (a dataset read in place)."""
    if folder is not None:
        key = xxhash.xxh64(os.path.realpath(index_json).encode()).hexdigest()
        return os.path.join(folder, f"{key}.astream-v{FORMAT_VERSION}.bin")
    head, tail = os.path.split(index_json)
    return os.path.join(head, f".{tail}.astream-v{FORMAT_VERSION}.bin")


def _stamp(st: os.stat_result) -> dict[str, int]:
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns}


def content_hash(path: str) -> str:
    """The xxh3-64 (hex) of a file's bytes, read in chunks (no whole copy held)."""
    digest = xxhash.xxh3_64()
    with open(path, "rb") as fh:
        while chunk := fh.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _current(binary: BinaryIndex, st: os.stat_result, index_json: str, known: str | None) -> bool:
    stamp = binary.stamp
    if stamp.get("size") != st.st_size:
        return False
    if stamp.get("mtime_ns") == st.st_mtime_ns:
        return True
    return bool(stamp.get("xxh3") == (known or content_hash(index_json)))


def _try_open(path: str, st: os.stat_result, index_json: str, known: str | None) -> BinaryIndex | None:
    """The binary index when it is sound and built from this ``index.json``, else None."""
    if not os.path.exists(path):
        return None
    try:
        binary = BinaryIndex.open(path, index_json)
    except IndexFormatError:
        return None  # corrupt: rebuilt by the caller
    if _current(binary, st, index_json, known):
        return binary
    binary.close()
    return None


def _read(index_json: str) -> tuple[bytes, os.stat_result]:
    try:
        with open(index_json, "rb") as fh:
            st = os.fstat(fh.fileno())
            if st.st_size > MAX_INDEX_BYTES:
                raise too_large(index_json, st.st_size)
            return fh.read(), st
    except FileNotFoundError as exc:
        raise IndexFormatError(f"{index_json}: no index.json here; is this an MDS dataset directory?") from exc
    except OSError as exc:
        raise IndexFormatError(f"{index_json}: cannot read index.json: {exc}") from exc


def _write_columns(index_json: str, out: BinaryIO) -> None:
    """Validate ``index_json`` shard by shard (as :meth:`Index.load`) into ``out``."""
    data, st = _read(index_json)
    # (the real path: what a clean-up of the folder can check is still there)
    stamp: dict[str, Any] = {**_stamp(st), "xxh3": xxhash.xxh3_64_hexdigest(data), "path": os.path.realpath(index_json)}
    try:
        text = data.decode("utf-8")
        del data  # (the text alone is held while the entries stream through)
        write_binary_index(out, stream_shards(text, index_json), stamp)
        return
    except (Unusual, UnicodeDecodeError, ValueError, RecursionError):
        pass  # not the plain shape, or invalid: the general reader decides (its error, or its index)
    text = ""
    out.seek(0)
    out.truncate()
    data, _ = _read(index_json)
    write_binary_index(out, iter(Index.from_bytes(data, index_json).shards), stamp)


def _build(index_json: str, path: str) -> None:
    fd, tmp = tempfile.mkstemp(prefix=os.path.basename(path) + ".", suffix=".tmp", dir=os.path.dirname(path))
    try:
        with os.fdopen(fd, "w+b") as out:
            _write_columns(index_json, out)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def attach_index(index_json: str, folder: str | None = None, known_hash: str | None = None) -> Index:
    """The index of ``index_json`` backed by the node's binary form (built here if needed).

    Args:
        index_json: the file.
        folder: where the binary form goes (see :func:`binary_path`; None: beside it).
        known_hash: :func:`content_hash` of ``index_json`` if the caller has it.

    Returns:
        An :class:`Index` whose ``shards`` are made on demand from the mapped columns.

    Raises:
        IndexFormatError: ``index_json`` is missing or malformed (as :meth:`Index.load`).
        OSError: the binary form cannot be written where it goes.
    """
    path = binary_path(index_json, folder)
    try:
        st = os.stat(index_json)
    except FileNotFoundError as exc:
        raise IndexFormatError(f"{index_json}: no index.json here; is this an MDS dataset directory?") from exc
    binary = _try_open(path, st, index_json, known_hash)
    if binary is None:
        with open(path + ".lock", "a+b") as lock:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX)  # the first process builds; the others wait
            st = os.stat(index_json)
            binary = _try_open(path, st, index_json, known_hash)
            if binary is None:
                _build(index_json, path)
                binary = BinaryIndex.open(path, index_json)
    return Index(ShardTable(binary), index_json)
