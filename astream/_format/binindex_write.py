"""The writer of the node's binary index (:mod:`astream._format.binindex` says the format):
one pass over validated shards, columns kept compact while they grow, then written with
their checksum."""

from __future__ import annotations

import json
import struct
import sys
from array import array
from collections.abc import Iterable, Mapping
from typing import Any, BinaryIO

import xxhash

from astream._format.columns import identity_text, shard_identity, shard_view, stored_algos
from astream._format.index import ShardInfo

__all__ = ["FILES", "FORMAT_VERSION", "MAGIC", "PREFIX", "write_binary_index"]

MAGIC = b"ASTRIDX\x00"
FORMAT_VERSION = 2  # 2: sizes column-major; config_firsts, identity; the dataset's digests
FILES = ("raw_data", "zip_data", "raw_meta", "zip_meta")
PREFIX = struct.Struct("<8sII")


def _hashes_text(hashes: Mapping[str, str]) -> str:
    return json.dumps(dict(hashes), separators=(",", ":")) if hashes else ""


class _Blob:
    """Strings appended as one UTF-8 blob and their end offsets (compact while it grows)."""

    def __init__(self) -> None:
        self.data = bytearray()
        self.ends = array("q", [0])

    def add(self, text: str) -> None:
        self.data += text.encode("utf-8")
        self.ends.append(len(self.data))


def write_binary_index(out: BinaryIO, shards: Iterable[ShardInfo], stamp: Mapping[str, Any]) -> int:
    """Write the columns of validated shards to ``out`` (a file open for writing), in one
    pass over ``shards`` (a parser's stream: no list of them is kept).

    Args:
        shards: the index's shards as :class:`ShardInfo` (already validated), in order.
        stamp: what identifies the ``index.json`` they come from (kept in the header).

    Returns:
        How many shards were written.
    """
    samples, sizes, config_ids, firsts = array("q"), [array("q") for _ in FILES], array("q"), array("q")
    names, hashes, conf = _Blob(), _Blob(), _Blob()
    configs: dict[str, int] = {}
    identity = bytearray(b"[")
    view = xxhash.xxh3_128()
    algos: set[str] | None = None
    n = 0
    for n, info in enumerate(shards, 1):
        samples.append(info.samples)
        for k, key in enumerate(FILES):
            f = getattr(info, key)
            names.add("" if f is None else f.basename)
            hashes.add("" if f is None else _hashes_text(f.hashes))
            sizes[k].append(-1 if f is None else f.bytes)
        obj = info.to_json()
        rest = json.dumps({k: v for k, v in obj.items() if k not in (*FILES, "samples")}, sort_keys=True)
        got = configs.get(rest)
        if got is None:
            got = configs[rest] = len(configs)
            conf.add(rest)
            firsts.append(n - 1)
        config_ids.append(got)
        # What the dataset hashes of every shard, worked out here once for every process.
        identity += (", " if n > 1 else "").encode() + identity_text([shard_identity(info)])[1:-1].encode()
        view.update(shard_view(info))
        have = stored_algos(info)
        algos = have if algos is None else algos & have
    identity += b"]"
    columns: list[tuple[str, array[int] | bytes | bytearray]] = [
        ("samples", samples), ("bytes", array("q", b"".join(c.tobytes() for c in sizes))), ("config", config_ids),
        ("name_offsets", names.ends), ("names", names.data), ("hash_offsets", hashes.ends), ("hashes", hashes.data),
        ("config_offsets", conf.ends), ("configs", conf.data), ("config_firsts", firsts), ("identity", identity),
    ]
    if sys.byteorder != "little":  # (array("q") is native; the file is little-endian)
        for _, col in columns:
            if isinstance(col, array):
                col.byteswap()
    table: dict[str, list[Any]] = {}
    offset = 0
    for name, col in columns:
        raw = col.tobytes() if isinstance(col, array) else bytes(col)
        table[name] = ["<i8" if isinstance(col, array) else "u1", offset, len(raw)]
        offset += -(-len(raw) // 8) * 8
    header = json.dumps({"num_shards": n, "stamp": dict(stamp), "columns": table, "view_digest": view.hexdigest(),
                         "identity_xxh64": xxhash.xxh64_hexdigest(bytes(identity)),
                         "algos": sorted(algos or ())}).encode()
    header += b" " * (-(PREFIX.size + len(header)) % 8)
    digest = xxhash.xxh3_64()
    for part in (PREFIX.pack(MAGIC, FORMAT_VERSION, len(header)), header):
        digest.update(part)
        out.write(part)
    for _, col in columns:
        raw = col.tobytes() if isinstance(col, array) else bytes(col)
        raw += b"\x00" * (-len(raw) % 8)
        digest.update(raw)
        out.write(raw)
    out.write(digest.digest())
    return n
