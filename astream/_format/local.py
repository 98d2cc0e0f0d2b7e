"""``LocalDataset``: a read-only, random-access view of an MDS dataset on local disk.

Shards are opened on first use: an uncompressed shard is mapped with ``mmap`` (the page
cache is the buffer, nothing is copied); a compressed one is read, checked and
decompressed once into memory. In memory rather than into a file beside it, because
a dataset directory is often read-only (a mounted bucket, a shared cache, the test
fixtures) and a local view should never write into it.
"""

from __future__ import annotations

import bisect
import mmap
import operator
import os
import threading
from collections import OrderedDict
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from astream._arrays import sorted_unique
from astream._format.compression import get_codec
from astream._format.gather import gather_batch
from astream._format.hashing import check_algorithm, hash_bytes
from astream._format.index import INDEX_NAME, FileInfo, Index, ShardInfo
from astream._format.names import check_split
from astream._format.record import RecordLayout
from astream._format.shard import ShardReader, map_file, out_of_range
from astream._format.split import SPLIT_FORMATS, TextLayout, TextShardReader
from astream.errors import (
    CompressionError,
    ConfigError,
    HashMismatchError,
    IndexFormatError,
    ShardFormatError,
)

__all__ = ["LocalDataset"]

# Each mmap holds a file descriptor, and each decompressed shard its raw bytes: keep
# the most recently used ones open within these bounds.
_MAX_OPEN_SHARDS = 256

AnyShardReader = ShardReader | TextShardReader
AnyLayout = RecordLayout | TextLayout
_MAX_DECOMPRESSED_BYTES = 1 << 30


class LocalDataset:
    """An MDS dataset (or one split of it) in a local directory.

    Reads may come from several threads at once. A LocalDataset pickles as its
    arguments, so it can be handed to worker processes, which reopen shards lazily.
    Besides MDS it reads the peer's text formats (``json``, ``csv``, ``tsv``, ``xsv``).

    Args:
        local: the dataset directory (the one holding index.json, or its splits).
        split: a sub-directory of ``local`` holding the split's index.json, or None.
        allow_unsafe_types: allow ``pkl`` columns, whose decoding can run arbitrary code.
        validate_hash: a hash algorithm (``"xxh64"``, ``"sha1"``...): check each shard file
            against index.json before its first use.

    Raises:
        IndexFormatError: index.json is missing or malformed, or shards disagree on columns.
        EncodingError: a column has an unknown encoding.
        CompressionError: a shard has an unknown compression.
        UnsafeTypeError: a column is ``pkl`` and ``allow_unsafe_types`` is False.
        ConfigError: ``validate_hash`` is unknown or missing from index.json.
    """

    def __init__(
        self,
        local: str | os.PathLike[str],
        split: str | None = None,
        allow_unsafe_types: bool = False,
        validate_hash: str | None = None,
    ) -> None:
        check_split(split)
        self._args = (os.fspath(local), split, allow_unsafe_types, validate_hash)
        self.root = os.path.join(os.fspath(local), split) if split else os.fspath(local)
        self.index = Index.load(os.path.join(self.root, INDEX_NAME))
        self.allow_unsafe_types = allow_unsafe_types
        self.validate_hash = None if validate_hash is None else check_algorithm(validate_hash, "validate_hash")
        self._layouts: list[AnyLayout] = []
        self._layout_cache: dict[tuple[Any, ...], RecordLayout] = {}
        for info in self.index.shards:
            self._layouts.append(self._check_shard(info))
        self._starts = [0]
        for info in self.index.shards:
            self._starts.append(self._starts[-1] + info.samples)
        self._starts_np = np.asarray(self._starts, np.int64)
        self._open: OrderedDict[int, tuple[AnyShardReader, int]] = OrderedDict()
        self._decompressed_bytes = 0
        self._lock = threading.Lock()
        self._hot: tuple[int, int, AnyShardReader] | None = None

    def _check_shard(self, info: ShardInfo) -> AnyLayout:
        source = self.index.source
        if info.compression is not None:
            try:
                get_codec(info.compression)
            except CompressionError as exc:
                raise CompressionError(f"{source}: shard {info.index} ({info.stored.basename}): {exc}") from None
        layout: AnyLayout
        if info.format in SPLIT_FORMATS:
            layout = TextLayout(info, source)
        else:
            # Shards of one dataset share their columns: parse and check them once.
            key = (info.column_names, info.column_encodings, info.column_sizes)
            cached = self._layout_cache.get(key)
            if cached is None:
                cached = self._layout_cache[key] = RecordLayout.from_shard(info, source, self.allow_unsafe_types)
            layout = cached
        if info.index and not layout.same_columns(self._layouts[0]):
            raise IndexFormatError(
                f"{source}: shard {info.index} has columns {dict(zip(layout.names, layout.specs, strict=True))}, shard 0 has "
                f"{dict(zip(self._layouts[0].names, self._layouts[0].specs, strict=True))}; one dataset must have one set of columns"
            )
        algo = self.validate_hash
        for stored in (info.stored, info.stored_meta):
            if algo is not None and stored is not None and algo not in stored.hashes:
                raise ConfigError(
                    f"validate_hash={algo!r}, but {source} records only {sorted(stored.hashes) or 'no hashes'} "
                    f"for {stored.basename}; pick one of those or validate_hash=None"
                )
        return layout

    # --- shape ------------------------------------------------------------------------

    def __len__(self) -> int:
        return self._starts[-1]

    @property
    def size(self) -> int:
        """The number of samples (as ``StreamingDataset.size``)."""
        return self._starts[-1]

    @property
    def num_shards(self) -> int:
        return len(self.index.shards)

    @property
    def columns(self) -> dict[str, str]:
        """Column name -> encoding string, in storage order (empty for a dataset without shards)."""
        if not self._layouts:
            return {}
        layout = self._layouts[0]
        return dict(zip(layout.names, layout.specs, strict=True))

    # --- samples ------------------------------------------------------------------------

    def _locate(self, index: int) -> tuple[int, int]:
        total = self._starts[-1]
        if not -total <= index < total:
            raise out_of_range(self.root, index, total)
        if index < 0:
            index += total
        shard = bisect.bisect_right(self._starts, index) - 1
        return shard, index - self._starts[shard]

    def __getitem__(self, index: int) -> dict[str, Any]:
        """Decode sample ``index`` (negative counts from the end).

        Raises:
            ConfigError: the index is out of range.
            ShardFormatError, HashMismatchError, CompressionError: its shard is bad.
            EncodingError: a value does not decode.
        """
        i = operator.index(index)
        hot = self._hot  # sequential and local reads hit the same shard: skip the lookup
        if hot is not None and hot[0] <= i < hot[1]:
            return hot[2].get(i - hot[0])
        shard, offset = self._locate(i)
        reader = self.shard(shard)
        self._hot = (self._starts[shard], self._starts[shard + 1], reader)
        return reader.get(offset)

    def __iter__(self) -> Iterator[dict[str, Any]]:
        for shard in range(self.num_shards):
            reader = self.shard(shard)
            for i in range(len(reader)):
                yield reader.get(i)

    def get_batch(self, ids: Sequence[int] | npt.NDArray[np.integer[Any]]) -> dict[str, Any]:
        """Decode many samples; values come back column by column in the order of ``ids``.

        Fixed-size numeric columns are arrays of shape ``(len(ids), *shape)``, others lists.
        """
        idx = np.asarray(ids, dtype=np.int64).reshape(-1)
        total = self._starts[-1]
        if idx.size and (idx.min() < -total or idx.max() >= total):
            raise out_of_range(self.root, int(idx[(idx < -total) | (idx >= total)][0]), total)
        idx = np.where(idx < 0, idx + total, idx)
        shards = np.searchsorted(self._starts_np, idx, side="right") - 1
        unique = sorted_unique(shards)
        if len(unique) == 1:
            shard = int(unique[0])
            return self.shard(shard).get_batch(idx - self._starts[shard])
        if not len(unique):
            return self._empty_batch()
        groups = [np.flatnonzero(shards == shard) for shard in unique.tolist()]
        sources = [self.shard(shard) for shard in unique.tolist()]
        offsets = [idx[at] - self._starts[shard] for shard, at in zip(unique.tolist(), groups, strict=True)]
        return gather_batch(sources, groups, offsets, len(idx), self.root)

    def _empty_batch(self) -> dict[str, Any]:
        if not self._layouts:
            return {}
        for shard in range(self.num_shards):
            return self.shard(shard).get_batch([])
        return {}

    # --- shards -------------------------------------------------------------------------

    def shard(self, position: int) -> AnyShardReader:
        """The reader of shard ``position``, opening (and validating) it on first use."""
        with self._lock:
            entry = self._open.get(position)
            if entry is not None:
                self._open.move_to_end(position)
                return entry[0]
        reader, held = self._open_shard(position)
        with self._lock:
            raced = self._open.get(position)
            if raced is not None:  # another thread opened it meanwhile: keep one copy
                return raced[0]
            self._open[position] = (reader, held)
            self._decompressed_bytes += held
            while len(self._open) > _MAX_OPEN_SHARDS or (
                self._decompressed_bytes > _MAX_DECOMPRESSED_BYTES and len(self._open) > 1
            ):
                # Dropped, not closed: another thread may still be decoding from it, and
                # the mapping is released when the last reference goes.
                _, (_old, old_held) = self._open.popitem(last=False)
                self._decompressed_bytes -= old_held
        return reader

    def _check_hash(self, path: str, data: bytes | bytearray | mmap.mmap, expected: dict[str, str] | Any) -> None:
        algo = self.validate_hash
        if algo is None:
            return
        digest = hash_bytes(algo, data)
        if digest != expected[algo]:
            raise HashMismatchError(
                f"{path}: {algo} digest {digest} differs from {expected[algo]} in index.json; "
                "the file is corrupt or stale: delete it so it is fetched or written again"
            )

    def _load(
        self, position: int, raw: FileInfo, zipped: FileInfo | None, compression: str | None
    ) -> tuple[bytes | bytearray | mmap.mmap, int, str]:
        """One file of a shard, uncompressed: (buffer, bytes held in memory, file name).

        A raw file present on disk is mapped (and preferred); otherwise the compressed file
        is read, hash-checked and decompressed in memory.
        """
        raw_path = os.path.join(self.root, raw.basename)
        if os.path.exists(raw_path) or zipped is None:
            if raw.bytes == 0 and os.path.isfile(raw_path) and os.path.getsize(raw_path) == 0:
                self._check_hash(raw_path, b"", raw.hashes)
                return b"", 0, raw_path  # an empty data file (a 0-sample text shard) cannot be mapped
            mapped = map_file(raw_path, position)
            try:
                if len(mapped) != raw.bytes:
                    raise ShardFormatError(
                        f"{raw_path} (shard {position}): the file has {len(mapped)} bytes, index.json says "
                        f"{raw.bytes}; it is stale or truncated: delete it so it is fetched again"
                    )
                # The hash first: a corrupt file is then reported as such, not as bad offsets.
                self._check_hash(raw_path, mapped, raw.hashes)
            except BaseException:
                mapped.close()
                raise
            return mapped, 0, raw_path
        zip_path = os.path.join(self.root, zipped.basename)
        try:
            with open(zip_path, "rb") as fh:
                stored = os.fstat(fh.fileno()).st_size
                if stored != zipped.bytes:  # read no more than the index describes
                    raise ShardFormatError(
                        f"{zip_path} (shard {position}): the file has {stored} bytes, index.json says "
                        f"{zipped.bytes}; it is stale or truncated: delete it so it is fetched again"
                    )
                data = fh.read()
        except OSError as exc:
            raise ShardFormatError(
                f"shard {position}: neither {raw_path} nor {zip_path} can be read ({exc}); the dataset is incomplete"
            ) from exc
        self._check_hash(zip_path, data, zipped.hashes)
        out = get_codec(compression or "").decompress(data, size=raw.bytes, name=f"{zip_path} (shard {position})")
        return out, len(out), zip_path

    def _open_shard(self, position: int) -> tuple[AnyShardReader, int]:
        info = self.index.shards[position]
        layout = self._layouts[position]
        data, held, name = self._load(position, info.raw_data, info.zip_data, info.compression)
        if isinstance(layout, RecordLayout):
            return ShardReader(data, layout, name=name, shard=position, expected_samples=info.samples), held
        assert info.raw_meta is not None
        meta, meta_held, _ = self._load(position, info.raw_meta, info.zip_meta, info.compression)
        reader = TextShardReader(meta, data, layout, name=name, shard=position, expected_samples=info.samples)
        return reader, held + meta_held

    def close(self) -> None:
        """Close every open shard. Idempotent; the dataset reopens shards if used again."""
        with self._lock:
            readers = [reader for reader, _ in self._open.values()]
            self._open.clear()
            self._hot = None
            self._decompressed_bytes = 0
        for reader in readers:
            reader.close()

    def __enter__(self) -> LocalDataset:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()

    def __getstate__(self) -> dict[str, Any]:
        # Only the configuration travels (to worker processes): maps, locks and open
        # shards are per process and reopen lazily.
        return {"args": self._args}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__init__(*state["args"])  # type: ignore[misc]

    def __repr__(self) -> str:
        return f"LocalDataset({self.root!r}, samples={len(self)}, shards={self.num_shards})"
