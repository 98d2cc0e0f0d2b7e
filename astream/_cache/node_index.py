"""The node's binary index: built once from ``index.json`` in the cache, mapped by every
process (:mod:`astream._format.binindex` is the format).

``<root>/index.json`` gets ``<root>/.index.json.astream-v1.bin`` beside it. A process:

1. stats ``index.json`` and opens the binary file (magic, version, length and checksum
   checked: :meth:`BinaryIndex.open`);
2. uses it when its stamp (size and modification time of the ``index.json`` it was built
   from) matches, or, when only the time differs (a re-download of the same index), when
   the xxh3-64 of ``index.json``'s bytes matches the one it recorded;
3. else, under an exclusive ``flock`` of ``<bin>.lock`` (the first process of the node
   builds, the others wait and then find it built), parses ``index.json`` with the same
   validator as ever, writes the columns to a temporary file, fsyncs and renames it into
   place: a crash never leaves a half-written index that a later process would trust.

A corrupt binary file (truncated, wrong checksum, another version) is rebuilt, never read.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import os
import tempfile
from typing import Any

import xxhash

from astream._format.binindex import FORMAT_VERSION, BinaryIndex, ShardTable, write_binary_index
from astream._format.index import MAX_INDEX_BYTES, Index, ShardInfo, too_large
from astream.errors import IndexFormatError, IndexJSONError

__all__ = ["attach_index", "binary_path"]

_CHUNK = 1 << 24


def binary_path(index_json: str) -> str:
    """Where the binary form of ``index_json`` lives (beside it, in the cache)."""
    head, tail = os.path.split(index_json)
    return os.path.join(head, f".{tail}.astream-v{FORMAT_VERSION}.bin")


def _stamp(st: os.stat_result) -> dict[str, int]:
    return {"size": st.st_size, "mtime_ns": st.st_mtime_ns}


def _content_hash(path: str) -> str:
    digest = xxhash.xxh3_64()
    with open(path, "rb") as fh:
        while chunk := fh.read(_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def _current(binary: BinaryIndex, st: os.stat_result, index_json: str) -> bool:
    stamp = binary.stamp
    if stamp.get("size") != st.st_size:
        return False
    if stamp.get("mtime_ns") == st.st_mtime_ns:
        return True
    return bool(stamp.get("xxh3") == _content_hash(index_json))


def _try_open(path: str, st: os.stat_result, index_json: str) -> BinaryIndex | None:
    """The binary index when it is sound and built from this ``index.json``, else None."""
    if not os.path.exists(path):
        return None
    try:
        binary = BinaryIndex.open(path, index_json)
    except IndexFormatError:
        return None  # corrupt: rebuilt by the caller
    if _current(binary, st, index_json):
        return binary
    binary.close()
    return None


def _parse(index_json: str) -> tuple[list[ShardInfo], dict[str, Any]]:
    """Validate ``index_json`` shard by shard (as :meth:`Index.load`), with its stamp."""
    try:
        with open(index_json, "rb") as fh:
            st = os.fstat(fh.fileno())
            if st.st_size > MAX_INDEX_BYTES:
                raise too_large(index_json, st.st_size)
            data = fh.read()
    except FileNotFoundError as exc:
        raise IndexFormatError(f"{index_json}: no index.json here; is this an MDS dataset directory?") from exc
    except OSError as exc:
        raise IndexFormatError(f"{index_json}: cannot read index.json: {exc}") from exc
    stamp: dict[str, Any] = {**_stamp(st), "xxh3": xxhash.xxh3_64_hexdigest(data)}
    try:
        obj = json.loads(data)
    except (ValueError, RecursionError):
        Index.from_bytes(data, index_json)  # raises the error index.json's reader raises
        raise IndexJSONError(f"{index_json}: not valid JSON") from None
    del data
    return list(Index.from_json(obj, index_json).shards), stamp


def _build(index_json: str, path: str) -> None:
    shards, stamp = _parse(index_json)
    fd, tmp = tempfile.mkstemp(prefix=os.path.basename(path) + ".", suffix=".tmp", dir=os.path.dirname(path))
    try:
        with os.fdopen(fd, "wb") as out:
            write_binary_index(out, iter(shards), len(shards), stamp)
            out.flush()
            os.fsync(out.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def attach_index(index_json: str) -> Index:
    """The index of ``index_json`` backed by the node's binary form (built here if needed).

    Returns:
        An :class:`Index` whose ``shards`` are made on demand from the mapped columns.

    Raises:
        IndexFormatError: ``index_json`` is missing or malformed (as :meth:`Index.load`).
    """
    path = binary_path(index_json)
    try:
        st = os.stat(index_json)
    except FileNotFoundError as exc:
        raise IndexFormatError(f"{index_json}: no index.json here; is this an MDS dataset directory?") from exc
    binary = _try_open(path, st, index_json)
    if binary is None:
        with open(path + ".lock", "a+b") as lock:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX)  # the first process builds; the others wait
            st = os.stat(index_json)
            binary = _try_open(path, st, index_json)
            if binary is None:
                _build(index_json, path)
                binary = BinaryIndex.open(path, index_json)
    return Index(ShardTable(binary), index_json)
