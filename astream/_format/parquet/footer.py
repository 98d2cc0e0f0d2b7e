"""A Parquet file's footer: where it lies, what it says, and the byte ranges it points to.

A Parquet file ends with its footer (Thrift ``FileMetaData``), the footer's length as a
little-endian uint32, and the magic ``PAR1``. The footer is found with plain ranged reads
of the end of the file once its size is known (no suffix ranges, which some servers do
not serve): :data:`TAIL_GUESS` bytes usually hold all of it, else a second read fetches
the rest (:func:`footer_start`).
"""

from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import Any

from astream.errors import MissingExtraError, ShardFormatError

__all__ = ["MAGIC", "TAIL_GUESS", "FileFooter", "RowGroupShape", "footer_start", "parse_footer", "pyarrow"]

MAGIC = b"PAR1"
# Bytes read from the end of a file in the first request: most footers fit.
TAIL_GUESS = 64 << 10


def pyarrow() -> tuple[Any, Any]:
    """``(pyarrow, pyarrow.parquet)``, or a MissingExtraError naming the extra."""
    try:
        import pyarrow as pa
        import pyarrow.parquet as pq
    except ImportError as exc:
        raise MissingExtraError("format='parquet'", "parquet", "pyarrow") from exc
    return pa, pq


def footer_start(name: str, size: int, tail: bytes) -> int:
    """Where the footer of the ``size``-byte file ``name`` begins, from its last bytes ``tail``.

    Raises:
        ShardFormatError: not a Parquet file (no magic), or a footer longer than the file.
    """
    if size < 12 or len(tail) < 8 or tail[-4:] != MAGIC:
        raise ShardFormatError(f"{name}: not a Parquet file (it does not end with {MAGIC!r})")
    (length,) = struct.unpack("<I", tail[-8:-4])
    start = int(size - 8 - length)
    if start < 4:
        raise ShardFormatError(
            f"{name}: its footer claims {length} bytes, more than the {size}-byte file holds; "
            "the file is truncated or not Parquet"
        )
    return start


@dataclass(frozen=True)
class RowGroupShape:
    """One row group: its rows, its uncompressed size and its column chunks' byte ranges."""

    num_rows: int
    total_byte_size: int
    chunks: dict[str, list[tuple[int, int]]]  # top-level column -> its leaf chunks' ranges
    null_counts: dict[str, int | None]  # top-level column -> nulls (None: no statistics)


@dataclass(frozen=True)
class FileFooter:
    """What the index needs of one file: its name, size, version and footer bytes.

    ``footer`` is the file's last ``size - footer_offset`` bytes (footer, length, magic).
    """

    name: str
    size: int
    etag: str | None
    footer: bytes

    @property
    def footer_offset(self) -> int:
        return self.size - len(self.footer)


def parse_footer(file: FileFooter, where: str) -> tuple[Any, list[RowGroupShape]]:
    """The file's Arrow schema and its row groups.

    Raises:
        ShardFormatError: the footer does not parse, or a column chunk lies outside the
            file's data (before the magic or over the footer).
    """
    pa, pq = pyarrow()
    name = f"{where}/{file.name}"
    try:
        meta = pq.read_metadata(pa.BufferReader(file.footer))
        schema = meta.schema.to_arrow_schema()
    except Exception as exc:  # pyarrow raises ArrowInvalid, OSError...
        raise ShardFormatError(f"{name}: the Parquet footer does not parse ({exc}); the file is corrupt") from exc
    groups = []
    for g in range(meta.num_row_groups):
        rg = meta.row_group(g)
        chunks: dict[str, list[tuple[int, int]]] = {}
        nulls: dict[str, int | None] = {}
        for c in range(rg.num_columns):
            col = rg.column(c)
            top = col.path_in_schema.split(".")[0]
            # Some writers record a dictionary page offset of 0 for "none": the chunk then
            # starts at its first data page.
            dictionary = col.dictionary_page_offset if col.has_dictionary_page else None
            start = min(dictionary, col.data_page_offset) if dictionary else col.data_page_offset
            end = start + col.total_compressed_size
            if start < 4 or end > file.footer_offset:
                raise ShardFormatError(
                    f"{name}: row group {g}, column {col.path_in_schema!r} points to bytes {start}:{end}, "
                    f"past the data of the {file.size}-byte file; the file is corrupt or truncated"
                )
            chunks.setdefault(top, []).append((start, end))
            stats = col.statistics
            count = stats.null_count if stats is not None and stats.has_null_count else None
            if top not in nulls or nulls[top] is not None:
                nulls[top] = None if count is None else (nulls.get(top) or 0) + count
        groups.append(RowGroupShape(rg.num_rows, rg.total_byte_size, chunks, nulls))
    return schema, groups
