"""The engine on datasets written by mosaicml-streaming 0.13 (tests/fixtures), every codec."""
# ruff: noqa: ASYNC240, SIM117

from __future__ import annotations

import json
from pathlib import Path

import pytest
from cachekit import tree

from astream._cache import Prefetcher, ShardEngine, load_index
from astream._format.compression import get_codec
from astream._format.hashing import hash_bytes
from astream._format.index import Index
from astream._storage import StorageOptions
from astream.testing import LoopbackServer, memory_bucket


@pytest.mark.parametrize("name", ["comp_none", "comp_zstd", "comp_gz", "comp_bz2", "comp_br", "comp_snappy"])
async def test_every_codec_round_trips_to_the_recorded_raw_digest(
    name: str, fixtures_dir: Path, tmp_path: Path, options: StorageOptions
) -> None:
    root = fixtures_dir / "mds" / name
    local = tmp_path / "cache"
    with LoopbackServer(str(root)) as server:
        index = await load_index(str(local), server.url)
        algo = index.shards[0].hashes[0]
        async with ShardEngine(index, str(local), server.url, options=options, validate_hash=algo) as engine:
            async with Prefetcher(engine, range(len(index.shards))) as shards:
                async for lease in shards:
                    with lease:
                        raw = index.shards[lease.shard].raw_data
                        assert hash_bytes(algo, Path(lease.path).read_bytes()) == raw.hashes[algo]
    assert [p for p in tree(local) if not p.endswith(".mds")] == ["index.json"]


async def test_a_split_of_a_recorded_dataset(fixtures_dir: Path, tmp_path: Path, options: StorageOptions) -> None:
    root = fixtures_dir / "mds" / "split_ds"
    with LoopbackServer(str(root)) as server:
        index = await load_index(str(tmp_path), server.url, "val")
        async with ShardEngine(index, str(tmp_path), server.url, "val", options=options) as engine:
            for i in range(len(index.shards)):
                async with engine.use(i) as path:
                    assert Path(path).read_bytes() == (root / "val" / index.shards[i].raw_data.basename).read_bytes()
    assert (tmp_path / "val" / "index.json").exists()


async def test_split_formats_bring_data_and_meta(tmp_path: Path, options: StorageOptions) -> None:
    """A JSONL shard is two files (data and .meta); both come, both count, both leave."""
    codec = get_codec("zstd")
    data, meta = b'{"a": 1}\n{"a": 2}\n', b"\x02\x00\x00\x00" + bytes(12) + b"{}"
    bucket = memory_bucket("split-format")
    entry = {
        "columns": {"a": "int"}, "compression": "zstd", "format": "json", "hashes": ["xxh64"],
        "newline": "\n", "samples": 2, "size_limit": None, "version": 2,
    }
    for kind, raw in (("data", data), ("meta", meta)):
        name = "shard.00000.json" + (".meta" if kind == "meta" else "")
        stored = codec.compress(raw)
        bucket[f"ds/{name}.zstd"] = stored
        entry[f"raw_{kind}"] = {"basename": name, "bytes": len(raw), "hashes": {"xxh64": hash_bytes("xxh64", raw)}}
        entry[f"zip_{kind}"] = {"basename": f"{name}.zstd", "bytes": len(stored),
                                "hashes": {"xxh64": hash_bytes("xxh64", stored)}}
    bucket["ds/index.json"] = json.dumps({"shards": [entry], "version": 2}).encode()
    index = await load_index(str(tmp_path), "memory://split-format/ds")
    assert isinstance(index, Index)
    async with ShardEngine(index, str(tmp_path), "memory://split-format/ds", options=options,
                           validate_hash="xxh64", cache_limit=2 * (len(data) + len(meta))) as engine:
        async with engine.use(0) as path:
            assert Path(path).read_bytes() == data
            assert (tmp_path / "shard.00000.json.meta").read_bytes() == meta
        assert engine.stats.cache_bytes == len(data) + len(meta)
    assert tree(tmp_path) == ["index.json", "shard.00000.json", "shard.00000.json.meta"]
