"""The kinds of shard a dataset can hold, behind one small reading interface.

The dataset layer reads every shard through :class:`SampleSource` (``num_samples``,
``get``, ``get_batch``, ``close``) and learns nothing else about its kind: an MDS shard
(:class:`~astream._format.shard.ShardReader`, one memory-mapped file) or a JSONL /
delimited-text shard (:class:`~astream._format.split.TextShardReader`, a data file and its
``.meta`` offsets) or a Parquet row group (:class:`~astream._format.parquet.reader.RowGroupReader`,
its cached column chunks, decoded once) or a WebDataset tar (:class:`~astream._format.webdataset.TarReader`).
:func:`layout_of` parses a shard's columns from its index entry (before
any download) and :func:`open_shard` opens the files the cache installed for it.
"""

from __future__ import annotations

import mmap
import os
from pathlib import PurePosixPath
from typing import Any, Protocol

from astream._format.index import ShardInfo
from astream._format.parquet.reader import ParquetLayout, RowGroupReader
from astream._format.record import RecordLayout
from astream._format.shard import ShardReader, map_file
from astream._format.split import SPLIT_FORMATS, TextLayout, TextShardReader
from astream._format.webdataset import TarLayout, TarReader

__all__ = ["SampleSource", "ShardLayout", "held_bytes", "layout_of", "open_shard"]

ShardLayout = RecordLayout | TextLayout | ParquetLayout | TarLayout


class SampleSource(Protocol):
    """What the reader needs of an open shard, whatever its kind."""

    @property
    def num_samples(self) -> int: ...

    @property
    def buffer(self) -> bytes | bytearray | mmap.mmap:
        """The buffer reads touch (a memory map's pages are handed back through it)."""

    def get(self, index: int) -> dict[str, Any]: ...

    def get_batch(self, ids: Any) -> dict[str, Any]: ...

    def close(self) -> None: ...


def layout_of(info: ShardInfo, source: str, allow_unsafe_types: bool) -> ShardLayout:
    """The columns of shard ``info`` of the index at ``source``, checked.

    Raises:
        EncodingError, IndexFormatError, UnsafeTypeError: the columns are unusable.
    """
    if info.format in SPLIT_FORMATS:
        return TextLayout(info, source)
    if info.format == "parquet":
        return ParquetLayout(info, source)
    if info.format == "webdataset":
        return TarLayout(info, source)
    # A writer repeats its columns in every shard entry: one layout (immutable) per
    # distinct set, checked once. At 10^4 streams of 100 shards, making one per shard was
    # most of a dataset's construction (~20 µs each).
    key = (info.column_names, info.column_encodings, info.column_sizes, allow_unsafe_types)
    layout = _RECORD_LAYOUTS.get(key)
    if layout is None:
        layout = RecordLayout.from_shard(info, source, allow_unsafe_types)
        if len(_RECORD_LAYOUTS) >= 4096:
            _RECORD_LAYOUTS.clear()
        _RECORD_LAYOUTS[key] = layout
    return layout


_RECORD_LAYOUTS: dict[tuple[Any, ...], RecordLayout] = {}


def open_shard(path: str, layout: ShardLayout, info: ShardInfo) -> SampleSource:
    """Open the installed shard whose (uncompressed) data file is ``path``, and validate it.

    A text shard's ``.meta`` file lies where the cache puts it beside the data file (both
    names are relative to the same dataset root).

    Raises:
        ShardFormatError: a file is missing, truncated or inconsistent with index.json.
    """
    if isinstance(layout, RecordLayout):
        return ShardReader.open(path, layout, shard=info.index, expected_samples=info.samples)
    if isinstance(layout, ParquetLayout):
        return RowGroupReader(path, layout, info)
    if isinstance(layout, TarLayout):
        return TarReader(path, layout, info)
    assert info.raw_meta is not None  # the index requires it for split formats
    root = path
    for _ in PurePosixPath(info.raw_data.basename).parts:
        root = os.path.dirname(root)
    meta_path = os.path.join(root, *info.raw_meta.basename.split("/"))
    meta = map_file(meta_path, info.index)
    try:
        # A 0-sample shard's data file is empty, and an empty file cannot be mapped.
        data = b"" if info.raw_data.bytes == 0 and os.path.getsize(path) == 0 else map_file(path, info.index)
        return TextShardReader(meta, data, layout, name=path, shard=info.index, expected_samples=info.samples)
    except BaseException:
        meta.close()
        raise


def held_bytes(source: SampleSource) -> int:
    """Memory an open shard holds of its own (decoded columns; a memory map holds none)."""
    return source.decoded_bytes if isinstance(source, (RowGroupReader, TarReader)) else 0
