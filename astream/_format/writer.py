"""``MDSWriter``: write samples into MDS shards in a local directory.

The output is byte for byte what MosaicML Streaming's writer produces for the same
samples and settings (uncompressed shards and index.json; compressed files may differ
where the compressor libraries differ, and gzip's header carries no timestamp here).
Shard rolling, compression, hashing and the index are :class:`ShardWriter`'s; this
module says what an MDS shard holds: uint32 ``n``, ``n + 1`` uint32 offsets, the
writer's config as JSON, then the records.
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from astream._format.index import FileInfo, ShardInfo
from astream._format.record import RecordLayout
from astream._format.shard_writer import ShardFile, ShardWriter, config_bytes

__all__ = ["MDSWriter"]


class MDSWriter(ShardWriter):
    """Write a MosaicML-Streaming-compatible MDS dataset into a local directory.

    Use it as a context manager, or call :meth:`finish` yourself::

        with MDSWriter("./ds", {"x": "ndarray:float32:3,32,32", "y": "int64"}, compression="zstd") as w:
            w.write({"x": x, "y": 3})

    Args:
        out: the output directory (created if needed).
        columns: column name -> encoding (``"int"``, ``"str"``, ``"ndarray:uint8:8"``...).
        compression: ``None`` or an algorithm like ``"zstd"``, ``"zstd:7"``, ``"gz"``, ``"br"``,
            ``"bz2"``, ``"snappy"``. With compression only the compressed shard files are kept.
        hashes: hash algorithms to record for every file (``["sha1", "xxh64"]``).
        size_limit: start a new shard before one would exceed this many bytes (an int or a
            string like ``"64mb"``); ``None`` or 0 puts everything into one shard.
        exist_ok: if ``out`` exists and is not empty, delete its contents (True) or raise (False).

    Raises:
        ConfigError: a bad ``out``, ``hashes`` or ``size_limit``.
        OutputExistsError: ``out`` is not empty and ``exist_ok`` is False (a ``FileExistsError``).
        EncodingError: a column has an unknown encoding.
        CompressionError: an unknown compression algorithm.
    """

    format = "mds"
    _sample_overhead = 4  # each record's offset entry

    def __init__(
        self,
        out: str | os.PathLike[str],
        columns: Mapping[str, str],
        compression: str | None = None,
        hashes: Sequence[str] | None = None,
        size_limit: int | str | None = 1 << 26,
        exist_ok: bool = False,
    ) -> None:
        super().__init__(out, columns, compression, hashes, size_limit, exist_ok)
        self.layout = RecordLayout.from_columns(columns)
        self._config = {
            **self._base_config(),
            "column_encodings": list(self.layout.specs),
            "column_names": list(self.layout.names),
            "column_sizes": list(self.layout.sizes),
        }
        self._config_bytes = config_bytes(self._config)
        self._shard_overhead = 4 + 4 + len(self._config_bytes)  # sample count, last offset, config
        self._start()

    def _encode(self, sample: Mapping[str, Any], position: int) -> bytes:
        return self.layout.encode(sample, position)

    def _shard_files(self, records: list[bytes]) -> list[ShardFile]:
        # The shard as pieces (header, config, records), to hash and write without a join.
        header = 4 + 4 * (len(records) + 1) + len(self._config_bytes)
        sizes = np.fromiter((len(r) for r in records), np.int64, len(records))
        offsets = np.concatenate(([0], np.cumsum(sizes))) + header
        head = np.uint32(len(records)).tobytes() + offsets.astype("<u4").tobytes()
        return [(None, [head, self._config_bytes, *records])]

    def _shard_entry(self, position: int, samples: int, files: list[tuple[FileInfo, FileInfo | None]]) -> ShardInfo:
        (raw_info, zip_info), = files
        return ShardInfo(
            index=position, format=self.format, samples=samples, raw_data=raw_info,
            zip_data=zip_info, compression=self.compression, hashes=tuple(self.hashes),
            column_names=self.layout.names, column_encodings=self.layout.specs,
            column_sizes=self.layout.sizes, size_limit=self.size_limit, config=dict(self._config),
        )

