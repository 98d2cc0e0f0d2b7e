"""ShardSink on its own: zstd decoded straight into the file, and every way the bytes can be wrong."""

from __future__ import annotations

import os
from pathlib import Path

import pytest
import zstandard

from astream._cache.install import CorruptFile, ShardSink
from astream._format.compression import get_codec

BOTH_LOOPS = True

RAW = os.urandom(300_000) * 3 + bytes(200_000)  # compressible, > several output windows


async def _install(tmp_path: Path, stored: bytes, raw_size: int = len(RAW), chunk: int = 7_000) -> Path:
    final = tmp_path / "shard.mds"
    sink = ShardSink(str(final), raw_size, codec=get_codec("zstd"), fsync=False)
    try:
        for i in range(0, len(stored), chunk):
            await sink.write(stored[i:i + chunk])
        await sink.finish()
    except BaseException:
        sink.abort()
        raise
    return final


def _leftovers(tmp_path: Path) -> list[str]:
    return sorted(p.name for p in tmp_path.iterdir())


async def test_zstd_decodes_to_the_same_bytes_in_one_or_many_frames(tmp_path: Path) -> None:
    one = zstandard.ZstdCompressor(level=3).compress(RAW)
    assert (await _install(tmp_path, one)).read_bytes() == RAW
    half = len(RAW) // 2
    two = zstandard.ZstdCompressor().compress(RAW[:half]) + zstandard.ZstdCompressor().compress(RAW[half:])
    assert (await _install(tmp_path, two, chunk=1 << 20)).read_bytes() == RAW


@pytest.mark.parametrize(
    ("damage", "message"),
    [
        (lambda b: b[: len(b) // 2], "decodes to"),  # truncated
        (lambda b: b + b"garbage!", "zstd"),  # trailing bytes that are not a frame
        (lambda b: b[:100] + bytes(len(b) - 100), "zstd"),  # zeroed
    ],
)
async def test_bad_zstd_is_corrupt_and_leaves_nothing(tmp_path: Path, damage: object, message: str) -> None:
    good = zstandard.ZstdCompressor().compress(RAW)
    with pytest.raises(CorruptFile, match=message):
        await _install(tmp_path, damage(good))  # type: ignore[operator]
    assert _leftovers(tmp_path) == []


async def test_more_bytes_than_the_index_says_is_corrupt(tmp_path: Path) -> None:
    good = zstandard.ZstdCompressor().compress(RAW)
    with pytest.raises(CorruptFile, match="more than"):
        await _install(tmp_path, good, raw_size=len(RAW) - 1)
    assert _leftovers(tmp_path) == []
