"""ShardSink: zstd decoded straight into the file, bad bytes, and kernel copies from a local remote."""
# ruff: noqa: ASYNC240, SIM117

from __future__ import annotations

import errno
import os
from pathlib import Path
from typing import Any

import pytest
import zstandard
from cachekit import raw_bytes

from astream._cache import ShardEngine
from astream._cache.install import CorruptFile, ShardSink
from astream._format.compression import get_codec
from astream._storage import StorageOptions
from astream.errors import CacheError, DownloadError

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


# -- a local-directory remote: one job per file, a kernel copy where nothing needs the bytes --------
@pytest.mark.parametrize("broken", ["", "copy_file_range", "copy_file_range+sendfile"])
async def test_uncompressed_local_shards_are_copied_by_the_kernel(
    make_dataset: Any, tmp_path: Path, options: StorageOptions, monkeypatch: pytest.MonkeyPatch, broken: str
) -> None:
    root, index = make_dataset(compression=None, sample_size=300_000)
    used: list[str] = []
    for name in ("copy_file_range", "sendfile"):
        real = getattr(os, name)

        def spy(*args: Any, _name: str = name, _real: Any = real) -> int:
            used.append(_name)
            if _name in broken.split("+"):
                raise OSError(errno.EXDEV, "Invalid cross-device link")
            return int(_real(*args))

        monkeypatch.setattr(os, name, spy)
    async with ShardEngine(index, str(tmp_path / "c"), str(root), options=options) as engine:
        for i in range(len(index.shards)):
            async with engine.use(i) as path:
                assert Path(path).read_bytes() == (root / index.shards[i].raw_data.basename).read_bytes()
        assert engine.stats.bytes_downloaded == sum(s.raw_data.bytes for s in index.shards)
    expected = {"": {"copy_file_range"}, "copy_file_range": {"copy_file_range", "sendfile"},
                "copy_file_range+sendfile": {"copy_file_range", "sendfile"}}[broken]
    assert set(used) == expected
    assert [p.name for p in (tmp_path / "c").iterdir() if p.name.endswith(".tmp")] == []


async def test_a_hash_check_or_a_codec_reads_the_bytes_in_the_thread(
    make_dataset: Any, tmp_path: Path, options: StorageOptions, monkeypatch: pytest.MonkeyPatch
) -> None:
    def no(*args: Any) -> int:
        raise AssertionError("no kernel copy when the bytes must be hashed or decoded")

    monkeypatch.setattr(os, "copy_file_range", no)
    monkeypatch.setattr(os, "sendfile", no)
    for compression, validate in ((None, "xxh64"), ("zstd", None)):
        root, index = make_dataset(f"r-{compression}", compression=compression)
        async with ShardEngine(index, str(tmp_path / f"c-{compression}"), str(root), options=options,
                               validate_hash=validate) as engine:
            async with engine.use(1) as path:
                assert Path(path).read_bytes() == raw_bytes(root, index, 1)


async def test_a_failed_kernel_copy_leaves_no_temporary(
    make_dataset: Any, tmp_path: Path, options: StorageOptions, monkeypatch: pytest.MonkeyPatch
) -> None:
    root, index = make_dataset(compression=None)
    local = tmp_path / "c"
    calls = 0

    def flaky(*args: Any) -> int:
        nonlocal calls
        calls += 1
        raise OSError(errno.EIO if calls == 1 else errno.ENOSPC, "boom")

    monkeypatch.setattr(os, "copy_file_range", flaky)
    async with ShardEngine(index, str(local), str(root), options=options) as engine:
        with pytest.raises(CacheError, match="disk full"):  # EIO: retried; ENOSPC: the cache's disk
            await engine.ensure(0)
    assert calls == 2
    assert sorted(p.name for p in local.iterdir()) == []


async def test_a_local_source_of_the_wrong_size_is_refused(
    make_dataset: Any, tmp_path: Path, options: StorageOptions
) -> None:
    root, index = make_dataset(compression=None)
    with (root / index.shards[0].raw_data.basename).open("ab") as fh:
        fh.write(b"more")
    async with ShardEngine(index, str(tmp_path / "c"), str(root), options=options) as engine:
        with pytest.raises(DownloadError, match=r"index\.json says"):
            await engine.ensure(0)
    assert list((tmp_path / "c").iterdir()) == []
