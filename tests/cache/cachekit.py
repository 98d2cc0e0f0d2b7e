"""Helpers of the cache tests: a small MDS dataset factory and file listings."""

from __future__ import annotations

import random
from pathlib import Path

from astream._format.index import Index
from astream._format.writer import MDSWriter


def write_dataset(
    root: Path,
    *,
    shards: int = 4,
    samples: int = 6,
    sample_size: int = 3000,
    compression: str | None = "zstd",
    hashes: tuple[str, ...] = ("sha1", "xxh64"),
    seed: int = 0,
) -> Index:
    """An MDS dataset of ``shards`` shards with ``samples`` samples each of random bytes."""
    rng = random.Random(seed)
    per_sample = sample_size + 8 + 4 + 4  # payload, int, head, offset
    overhead = 600  # the embedded config and the shard header
    with MDSWriter(
        str(root), {"data": "bytes", "i": "int"}, compression=compression, hashes=list(hashes),
        size_limit=overhead + per_sample * samples, exist_ok=True,
    ) as writer:
        for i in range(shards * samples):
            writer.write({"data": rng.randbytes(sample_size // 2) * 2, "i": i})
    index = Index.load(root / "index.json")
    assert len(index.shards) == shards, [s.samples for s in index.shards]
    return index


def raw_bytes(root: Path, index: Index, i: int) -> bytes:
    """The decompressed bytes of shard ``i`` of the dataset at ``root``."""
    from astream._format.compression import get_codec

    shard = index.shards[i]
    data = (root / shard.stored.basename).read_bytes()
    return bytes(get_codec(shard.compression).decompress(data, size=shard.raw_data.bytes)) if shard.compression else data


def tree(root: Path) -> list[str]:
    """Every file under ``root``, relative, sorted."""
    if not root.exists():
        return []
    return sorted(str(p.relative_to(root)) for p in root.rglob("*") if p.is_file())


def temporaries(root: Path) -> list[str]:
    return [p for p in tree(root) if p.endswith(".tmp")]
