"""Datasets with planted faults, for the on_bad_sample tests (one writer per format, then
one fault each: a record that does not decode, a truncated shard, a flipped byte, a row
group that does not decode, a truncated tar member)."""

from __future__ import annotations

import io
import json
import tarfile
from pathlib import Path
from typing import Any

import zstandard

from astream import JSONWriter, MDSWriter
from astream._format.hashing import hash_bytes

MDS_COLUMNS = {"id": "int64", "meta": "json", "pad": "bytes"}


def mds_sample(i: int) -> dict[str, Any]:
    return {"id": i, "meta": {"i": i}, "pad": bytes([i % 251]) * 40}


def write_mds(out: Path, count: int, *, compression: str | None = None, hashes: list[str] | None = None,
              first: int = 0, size_limit: int = 1200) -> list[dict[str, Any]]:
    """``count`` samples (ids from ``first``) in shards of ~``size_limit`` bytes; returns the index's shards."""
    with MDSWriter(out=str(out), columns=MDS_COLUMNS, compression=compression, hashes=hashes,
                   size_limit=size_limit) as writer:
        for i in range(first, first + count):
            writer.write(mds_sample(i))
    shards: list[dict[str, Any]] = json.loads((out / "index.json").read_text())["shards"]
    return shards


def _rewrite_index(out: Path, shards: list[dict[str, Any]]) -> None:
    index = json.loads((out / "index.json").read_text())
    index["shards"] = shards
    (out / "index.json").write_text(json.dumps(index))


def corrupt_mds_record(out: Path, sample: int) -> str:
    """Sample ``sample``'s json no longer parses (same length); a zstd shard is compressed
    again and its index entry updated, so only the record is bad. Returns the shard file."""
    shards = json.loads((out / "index.json").read_text())["shards"]
    old, new = b'{"i": %d}' % sample, b'{"i"; %d}' % sample
    for shard in shards:
        zipped = shard.get("zip_data")
        path = out / (zipped or shard["raw_data"])["basename"]
        data = path.read_bytes()
        raw = zstandard.ZstdDecompressor().decompress(data) if zipped else data
        if old not in raw:
            continue
        raw = raw.replace(old, new, 1)
        if zipped:
            data = zstandard.ZstdCompressor().compress(raw)
            zipped["bytes"] = len(data)
            zipped["hashes"] = {algo: hash_bytes(algo, data) for algo in zipped.get("hashes", {})}
            shard["raw_data"]["hashes"] = {algo: hash_bytes(algo, raw) for algo in shard["raw_data"].get("hashes", {})}
            path.write_bytes(data)
        else:
            path.write_bytes(raw)
        _rewrite_index(out, shards)
        return str(shard["raw_data"]["basename"])
    raise AssertionError(f"sample {sample} not found under {out}")


def truncate_file(path: Path, keep: float = 0.5) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: int(len(data) * keep)])


def flip_byte(path: Path, at: float = 0.5) -> None:
    data = bytearray(path.read_bytes())
    data[int(len(data) * at)] ^= 0xFF
    path.write_bytes(bytes(data))


TEXT_COLUMNS = {"id": "int", "text": "str"}


def text_sample(i: int) -> dict[str, Any]:
    return {"id": i, "text": f"row {i}"}


def write_jsonl(out: Path, count: int, bad: int) -> None:
    """JSON-lines shards of ``count`` rows; row ``bad`` does not parse (same length)."""
    with JSONWriter(out=str(out), columns=TEXT_COLUMNS, size_limit=400) as writer:
        for i in range(count):
            writer.write(text_sample(i))
    for path in sorted(out.glob("shard.*.json")):
        data = path.read_bytes()
        old = b'{"id": %d,' % bad
        if old in data:
            path.write_bytes(data.replace(old, b'{"id": %d;' % bad, 1))
            return
    raise AssertionError(f"row {bad} not found under {out}")


def wds_members(i: int) -> dict[str, bytes]:
    return {"cls": str(i).encode(), "txt": (b"sample %d " % i) * 8}


def write_tar(path: Path, first: int, count: int) -> None:
    """One tar of samples ``first..first+count-1`` (members ``cls`` and ``txt``)."""
    with tarfile.open(path, "w") as tar:
        for i in range(first, first + count):
            for ext, data in wds_members(i).items():
                info = tarfile.TarInfo(f"train/{i:06d}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))


def truncate_member(path: Path, sample: int) -> None:
    """Cut the tar inside sample ``sample``'s ``txt`` member (after its index was written):
    that member is short, and the samples after it are gone."""
    data = path.read_bytes()
    at = data.index(f"train/{sample:06d}.txt".encode())
    path.write_bytes(data[: at + 512 + 10])


def plant_parquet(root: Path, groups: tuple[int, ...], bad_group: int) -> None:
    """One Parquet file of ``groups`` row groups, indexed; row group ``bad_group``'s first page
    header no longer decodes."""
    import warnings

    import parquet_data as pdata
    import pyarrow.parquet as pq

    from astream.cli import main as cli
    from astream.errors import LayoutWarning

    pdata.write(root, files=1, groups=groups)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", LayoutWarning)  # (small row groups are what the fault needs)
        assert cli(["-q", "index", str(root)]) == 0
    path = root / "part-00.parquet"
    column = pq.ParquetFile(path).metadata.row_group(bad_group).column(0)
    data = bytearray(path.read_bytes())
    for k in range(column.data_page_offset, column.data_page_offset + 40):
        data[k] ^= 0x5A
    path.write_bytes(bytes(data))


def plant_webdataset(root: Path, tars: int, per_tar: int, cut_in: int) -> None:
    """``tars`` tars of ``per_tar`` samples, indexed; the tar holding sample ``cut_in`` is cut there."""
    from astream.cli import main as cli

    root.mkdir(parents=True)
    for k in range(tars):
        write_tar(root / f"shard-{k:03d}.tar", k * per_tar, per_tar)
    assert cli(["-q", "index", str(root)]) == 0
    truncate_member(root / f"shard-{cut_in // per_tar:03d}.tar", cut_in)
