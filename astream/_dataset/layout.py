"""Where each global sample id lives: stream, shard and position in the shard.

Global ids index the concatenation of every stream's shards, in stream order (as the
epoch plan numbers them). Lookups are vectorised with ``searchsorted``; nothing here
holds a Python object per sample.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

import numpy as np
import numpy.typing as npt

from astream._format.index import Index
from astream._format.kinds import ShardLayout, layout_of

__all__ = ["SampleMap"]

Int64Array = npt.NDArray[np.int64]


class SampleMap:
    """The shards of all streams, laid end to end.

    Args:
        indexes: each stream's index.
        allow_unsafe_types: allow ``pkl`` columns (checked here, before any download).

    Raises:
        UnsafeTypeError, EncodingError, IndexFormatError: a shard's columns are unusable.
    """

    def __init__(self, indexes: Sequence[Index], allow_unsafe_types: bool) -> None:
        self.indexes = list(indexes)
        self.shard_stream: list[int] = []
        self.shard_local: list[int] = []
        self.layouts: list[ShardLayout] = []
        sizes: list[int] = []
        for s, index in enumerate(self.indexes):
            for info in index.shards:
                self.shard_stream.append(s)
                self.shard_local.append(info.index)
                self.layouts.append(layout_of(info, index.source, allow_unsafe_types))
                sizes.append(info.samples)
        self.starts: Int64Array = np.zeros(len(sizes) + 1, np.int64)
        np.cumsum(sizes, out=self.starts[1:])
        self.stream_sizes = [index.num_samples for index in self.indexes]

    @functools.cached_property
    def mean_record_bytes(self) -> npt.NDArray[np.float64]:
        """The mean bytes per sample of each shard (its uncompressed file over its samples).

        Worked out once: every epoch reader of the process uses it, and a loop over 100k
        shards costs ~20 ms.
        """
        return np.asarray(
            [sh.raw_data.bytes / max(1, sh.samples) for index in self.indexes for sh in index.shards], np.float64
        )

    @property
    def num_samples(self) -> int:
        return int(self.starts[-1])

    def shard_file(self, sample: int) -> str:
        """The file name of the shard that holds ``sample``."""
        shard, _ = self.locate_one(sample)
        return self.indexes[self.shard_stream[shard]].shards[self.shard_local[shard]].raw_data.basename

    def describe(self, sample: int) -> str:
        """Sample ``sample`` for a message: its id, record, shard file and stream."""
        shard, offset = self.locate_one(sample)
        stream, local = self.shard_stream[shard], self.shard_local[shard]
        name = self.indexes[stream].shards[local].raw_data.basename
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

    def stream_shard_sizes(self) -> list[list[int]]:
        """Per stream, its shards' sample counts (what the epoch plan needs)."""
        return [index.shard_sizes for index in self.indexes]
