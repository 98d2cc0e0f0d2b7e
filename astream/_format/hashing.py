"""Hash algorithms MDS accepts for shard files, with one streaming interface.

The names are hashlib's (``md5``, ``sha1``, ``sha224`` ... ``sha512``, ``sha3_*``,
``blake2b``, ``blake2s``) plus xxhash's (``xxh32``, ``xxh64``, ``xxh128``,
``xxh3_64``, ``xxh3_128``). Digests are lowercase hex, as index.json stores them.
"""

from __future__ import annotations

import hashlib
import mmap
from collections.abc import Callable
from typing import Any, Protocol

import xxhash

from astream.errors import ConfigError

__all__ = ["HASH_ALGORITHMS", "Hasher", "check_algorithm", "hash_bytes", "new_hasher"]


class Hasher(Protocol):
    """What both hashlib and xxhash objects offer."""

    def update(self, data: bytes | bytearray | memoryview | mmap.mmap, /) -> None: ...

    def hexdigest(self) -> str: ...


_HASHLIB = (
    "md5", "sha1", "sha224", "sha256", "sha384", "sha512",
    "sha3_224", "sha3_256", "sha3_384", "sha3_512", "blake2b", "blake2s",
)
_XXHASH: dict[str, Callable[[], Any]] = {
    "xxh32": xxhash.xxh32,
    "xxh64": xxhash.xxh64,
    "xxh128": xxhash.xxh128,
    "xxh3_64": xxhash.xxh3_64,
    "xxh3_128": xxhash.xxh3_128,
}

HASH_ALGORITHMS: tuple[str, ...] = tuple(sorted((*_HASHLIB, *_XXHASH)))


def check_algorithm(algo: str, name: str = "hash") -> str:
    """Return ``algo`` if it is a known hash, else raise ConfigError naming ``name``."""
    if algo not in HASH_ALGORITHMS:
        raise ConfigError(f"{name}={algo!r} is not a known hash; use one of {', '.join(HASH_ALGORITHMS)}")
    return algo


def new_hasher(algo: str) -> Hasher:
    """A fresh incremental hasher for ``algo`` (feed it chunks as they arrive)."""
    check_algorithm(algo)
    factory = _XXHASH.get(algo)
    hasher: Hasher = factory() if factory is not None else hashlib.new(algo)
    return hasher


def hash_bytes(algo: str, data: bytes | bytearray | memoryview | mmap.mmap) -> str:
    """Hex digest of ``data`` with ``algo``.

    Any buffer works, and is hashed in place: an mmap of a 64 MB shard is not copied.
    """
    hasher = new_hasher(algo)
    hasher.update(data)
    return hasher.hexdigest()
