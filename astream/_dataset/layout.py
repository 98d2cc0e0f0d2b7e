"""Where each global sample id lives: stream, shard and position in the shard.

Global ids index the concatenation of every stream's shards, in stream order (as the
epoch plan numbers them). Lookups are vectorised with ``searchsorted``; nothing here
holds a Python object per sample.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from typing import Any, overload

import numpy as np
import numpy.typing as npt

from astream._format.columns import IndexColumns, columns_of
from astream._format.index import Index, ShardInfo
from astream._format.kinds import ShardLayout, layout_of

__all__ = ["IntColumn", "Layouts", "SampleMap"]

Int64Array = npt.NDArray[np.int64]


class IntColumn(Sequence[int]):
    """An int64 array read as a sequence of Python ints (as the lists it replaces were read);
    ``np.asarray`` of it is the array itself."""

    def __init__(self, values: Int64Array) -> None:
        self.values = values

    def __len__(self) -> int:
        return len(self.values)

    @overload
    def __getitem__(self, i: int) -> int: ...
    @overload
    def __getitem__(self, i: slice) -> Sequence[int]: ...
    def __getitem__(self, i: int | slice) -> int | Sequence[int]:
        if isinstance(i, slice):
            return self.values[i].tolist()  # type: ignore[no-any-return]
        return int(self.values[i])

    def __iter__(self) -> Iterator[int]:
        return iter(self.values.tolist())

    def __array__(self, dtype: Any = None, copy: Any = None) -> Int64Array:
        return self.values if dtype is None else self.values.astype(dtype, copy=False)


class Layouts(Sequence[ShardLayout]):
    """Every shard's layout: one per distinct writer config, and which one each shard has."""

    def __init__(self, distinct: list[ShardLayout], ids: Int64Array) -> None:
        self.distinct, self.ids = distinct, ids

    def __len__(self) -> int:
        return len(self.ids)

    @overload
    def __getitem__(self, i: int) -> ShardLayout: ...
    @overload
    def __getitem__(self, i: slice) -> Sequence[ShardLayout]: ...
    def __getitem__(self, i: int | slice) -> ShardLayout | Sequence[ShardLayout]:
        if isinstance(i, slice):
            return [self.distinct[k] for k in self.ids[i].tolist()]
        return self.distinct[int(self.ids[i])]


class SampleMap:
    """The shards of all streams, laid end to end.

    Built from each index's columns (:func:`~astream._format.columns.columns_of`): for an
    index mapped from the node's binary form no shard is made but the first of each writer
    config, so a rank holds arrays, not an object per shard; ``shard_info`` makes one when
    it is needed.

    Args:
        indexes: each stream's index.
        allow_unsafe_types: allow ``pkl`` columns (checked here, before any download).

    Raises:
        UnsafeTypeError, EncodingError, IndexFormatError: a shard's columns are unusable.
    """

    def __init__(self, indexes: Sequence[Index], allow_unsafe_types: bool) -> None:
        self.indexes = list(indexes)
        self.index_columns: list[IndexColumns] = [columns_of(index) for index in self.indexes]
        counts = np.array([len(c.samples) for c in self.index_columns], np.int64)
        self.first_shard: Int64Array = np.zeros(len(counts) + 1, np.int64)
        np.cumsum(counts, out=self.first_shard[1:])
        total = int(self.first_shard[-1])
        stream = np.repeat(np.arange(len(counts), dtype=np.int64), counts)
        self.shard_stream = IntColumn(stream)
        self.shard_local = IntColumn(np.arange(total, dtype=np.int64) - self.first_shard[stream])
        distinct: list[ShardLayout] = []
        self.layout_entries: list[ShardInfo] = []  # per distinct layout, a shard of it
        ids = np.empty(total, np.int64)
        for s, (index, cols) in enumerate(zip(self.indexes, self.index_columns, strict=True)):
            lo = int(self.first_shard[s])
            if any(r.format in ("parquet", "webdataset") for r in cols.representatives):
                # (their layouts read each shard's own entry: one each, as ever)
                for k, info in enumerate(index.shards):
                    ids[lo + k] = len(distinct)
                    distinct.append(layout_of(info, index.source, allow_unsafe_types))
                    self.layout_entries.append(info)
                continue
            # Shards of one writer config share a layout: the first of each is checked (in
            # order of first use, so the first unusable shard is the one named).
            ids[lo : int(self.first_shard[s + 1])] = cols.groups + len(distinct)
            distinct.extend(layout_of(rep, index.source, allow_unsafe_types) for rep in cols.representatives)
            self.layout_entries.extend(cols.representatives)
        self.layouts = Layouts(distinct, ids)
        sizes = np.concatenate([c.samples for c in self.index_columns]) if counts.size else np.zeros(0, np.int64)
        self.starts: Int64Array = np.zeros(total + 1, np.int64)
        np.cumsum(sizes, out=self.starts[1:])
        self.stream_sizes = [int(c.samples.sum()) for c in self.index_columns]
        raw = np.concatenate([c.raw_bytes for c in self.index_columns]) if counts.size else np.zeros(0, np.int64)
        # The mean bytes per sample of each shard (its uncompressed file over its samples):
        # every epoch reader of the process uses it.
        self.mean_record_bytes: npt.NDArray[np.float64] = raw / np.maximum(1, sizes)

    def shard_info(self, shard: int) -> ShardInfo:
        """Global shard ``shard``'s entry (made on demand from a mapped index)."""
        return self.indexes[int(self.shard_stream.values[shard])].shards[int(self.shard_local.values[shard])]

    @property
    def num_samples(self) -> int:
        return int(self.starts[-1])

    def shard_file(self, sample: int) -> str:
        """The file name of the shard that holds ``sample``."""
        shard, _ = self.locate_one(sample)
        return self.shard_info(shard).raw_data.basename

    def describe(self, sample: int) -> str:
        """Sample ``sample`` for a message: its id, record, shard file and stream."""
        shard, offset = self.locate_one(sample)
        stream = self.shard_stream[shard]
        name = self.shard_info(shard).raw_data.basename
        return f"sample {sample} (record {offset} of shard {name}, stream {stream})"

    @property
    def columns(self) -> dict[str, str]:
        """Column name -> encoding, of the first stream's first shard."""
        layout = self.layouts[0] if self.layouts else None
        return {} if layout is None else dict(zip(layout.names, layout.specs, strict=True))

    @property
    def num_shards(self) -> int:
        return len(self.layouts)

    def locate(self, ids: Int64Array) -> tuple[Int64Array, Int64Array]:
        """Global shard number and offset within it, for each id (all ids valid)."""
        # The count of shard ends at or below each id is its shard (ids are below the total).
        shard = np.searchsorted(self.starts[1:-1], ids, side="right").astype(np.int64, copy=False)
        return shard, ids - self.starts[shard]

    def locate_one(self, sample: int) -> tuple[int, int]:
        shard = int(np.searchsorted(self.starts, sample, side="right")) - 1
        return shard, sample - int(self.starts[shard])

    def stream_shard_sizes(self) -> list[Int64Array]:
        """Per stream, its shards' sample counts (what the epoch plan needs)."""
        return [c.samples for c in self.index_columns]

