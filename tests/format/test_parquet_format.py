"""The pure Parquet pieces: footers, the row-group index, the range-mapped file, kinds;
and WebDataset key splitting and tar scans."""

from __future__ import annotations

import io
import struct
import tarfile
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from astream._format.index import Index
from astream._format.parquet.build import build_index, column_kind
from astream._format.parquet.footer import FileFooter, footer_start, parse_footer
from astream._format.parquet.reader import _Mapped
from astream._format.webdataset import scan_tar, split_name
from astream.errors import ShardFormatError


def _footer(path: Path) -> FileFooter:
    raw = path.read_bytes()
    start = footer_start(str(path), len(raw), raw[-1024:])
    return FileFooter(path.name, len(raw), "v1", raw[start:])


def test_footer_and_index_agree_with_pyarrow(tmp_path: Path) -> None:
    table = pa.table({"a": list(range(3000)), "b": [str(i) for i in range(3000)], "c": [float(i) for i in range(3000)]})
    path = tmp_path / "t.parquet"
    pq.write_table(table, path, row_group_size=1000)
    footer = _footer(path)
    schema, groups = parse_footer(footer, str(tmp_path))
    meta = pq.read_metadata(path)
    assert schema.names == ["a", "b", "c"]
    assert [g.num_rows for g in groups] == [1000, 1000, 1000]
    for g, shape in enumerate(groups):
        col = meta.row_group(g).column(1)
        start = col.dictionary_page_offset if col.has_dictionary_page else col.data_page_offset
        assert shape.chunks["b"] == [(start, start + col.total_compressed_size)]
        assert shape.null_counts["b"] == 0
    index = build_index([footer], ["c", "a"], str(tmp_path))
    assert [sh.samples for sh in index.shards] == [1000, 1000, 1000]
    first = index.shards[0]
    assert first.column_names == ("c", "a")
    assert first.source is not None
    # The projected chunks (a and c are not adjacent in the file: b lies between) and the footer.
    a, c = groups[0].chunks["a"][0], groups[0].chunks["c"][0]
    assert first.source.ranges == (a, c, (footer.footer_offset, footer.size))
    assert first.raw_data.bytes == sum(e - s for s, e in first.source.ranges)
    assert first.source.etag == "v1"
    assert Index.from_bytes(index.dumps()).shards == index.shards  # the index.json round trip


def test_footer_errors_name_the_file() -> None:
    with pytest.raises(ShardFormatError, match=r"f\.parquet: not a Parquet file"):
        footer_start("f.parquet", 100, b"x" * 100)
    with pytest.raises(ShardFormatError, match="its footer claims 1000 bytes"):
        footer_start("f.parquet", 100, b"x" * 92 + struct.pack("<I", 1000) + b"PAR1")


def test_mapped_file_reads_ranges_at_their_offsets_and_zeros_between() -> None:
    local = b"ABCDEFGH"  # bytes 10:14 and 20:24 of a 30-byte file
    f = _Mapped(local, [(10, 14), (20, 24)], 30)
    f.seek(8)
    assert f.read(18) == b"\0\0ABCD" + b"\0" * 6 + b"EFGH\0\0"
    assert f.seek(0, 2) == 30
    f.seek(22)
    assert f.read(100) == b"GH" + b"\0" * 6
    out = bytearray(b"\xff" * 24)  # what the caller's buffer held before is overwritten, gaps with zeros
    f.seek(0)
    assert f.readinto(out) == 24
    assert bytes(out) == b"\0" * 10 + b"ABCD" + b"\0" * 6 + b"EFGH"
    out = bytearray(b"\xff" * 3)
    f.seek(14)
    assert f.readinto(out) == 3
    assert bytes(out) == b"\0\0\0"


def test_column_kinds() -> None:
    assert column_kind(pa.int32(), False) == ("array", "int32")
    assert column_kind(pa.int32(), True) == ("scalars", "nullable:int32")
    assert column_kind(pa.string(), True) == ("str", "str")
    assert column_kind(pa.binary(3), False) == ("bytes", "bytes")
    assert column_kind(pa.list_(pa.float32(), 4), False) == ("fixed", "ndarray:float32:4")
    assert column_kind(pa.list_(pa.float32(), 4), True) == ("ndarray", "ndarray:float32")
    assert column_kind(pa.list_(pa.int8()), False) == ("ndarray", "ndarray:int8")
    assert column_kind(pa.timestamp("ms"), False) == ("array", "datetime64[ms]")
    assert column_kind(pa.timestamp("ms", tz="UTC"), False) == ("object", "json")
    assert column_kind(pa.struct([("x", pa.int8())]), False) == ("object", "json")


def test_webdataset_keys_and_scan(tmp_path: Path) -> None:
    assert split_name("train/000123.seg.jpg") == ("train/000123", "seg.jpg")
    assert split_name("a.b/c.txt") == ("a.b/c", "txt")
    assert split_name("noext") == ("noext", "")
    path = tmp_path / "s.tar.gz"
    with tarfile.open(path, "w:gz") as tar:
        for name, size in (("k1.a", 3), ("k1.b", 0), ("k2.a", 5), ("k1.a", 1)):  # k1 again: a new sample
            info = tarfile.TarInfo(name)
            info.size = size
            tar.addfile(info, io.BytesIO(b"x" * size))
    summary = scan_tar(str(path), "s.tar.gz")
    assert summary.samples == 3
    assert summary.extensions == ("a", "b")
    assert summary.largest == 5
