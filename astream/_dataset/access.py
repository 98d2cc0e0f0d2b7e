"""Random access to a dataset's samples (``ds[i]``, ``get_item``, ``get_batch``), and the
checks of the indexes it takes.

:class:`RandomAccess` is the part of ``StreamingDataset`` a subclass hooks into, as with
MosaicML: ``__getitem__`` (the stored sample with ``transform`` applied) over
``get_item`` (the stored sample). Iteration goes through the same two methods whenever
either is overridden or a transform is set (see :mod:`astream._dataset.read.samples`).
"""

from __future__ import annotations

import asyncio
from collections.abc import Sequence
from typing import Any

import numpy as np

from astream._dataset.config import DatasetConfig
from astream._dataset.layout import SampleMap
from astream._dataset.read.samples import SampleSteps, read_inline
from astream._dataset.runtime import portal
from astream._dataset.session import NodeSession
from astream._format.selection import MANY, sub_indexes
from astream.errors import ConfigError, SampleIndexError

__all__ = ["RandomAccess", "check_index", "check_indexes"]


def check_index(index: object, size: int) -> int:
    """``index`` as a non-negative int below ``size`` (negative ones count from the end).

    Raises:
        ConfigError: not an integer.
        SampleIndexError: out of range.
    """
    if isinstance(index, (bool, np.bool_)) or not isinstance(index, (int, np.integer)):
        raise ConfigError(f"sample index must be an int (or, for ds[...], a slice, a list or an array of ints), "
                          f"got {type(index).__name__}")
    i = int(index) + size if index < 0 else int(index)
    if not 0 <= i < size:
        raise SampleIndexError(f"sample {index} is out of range for a dataset of {size} samples")
    return i


def check_indexes(ids: Sequence[int] | np.ndarray, size: int) -> np.ndarray:
    """Validate sample indexes at once, as :func:`check_index` does one."""
    raw = np.asarray(ids)
    if raw.size and (raw.dtype.kind not in "iu" or raw.dtype == np.bool_):
        raise ConfigError(f"sample indexes must be integers, got an array of {raw.dtype}")
    array = raw.reshape(-1).astype(np.int64)
    array = np.where(array < 0, array + size, array)
    bad = np.flatnonzero((array < 0) | (array >= size))
    if bad.size:
        raise SampleIndexError(f"sample {raw.reshape(-1)[bad[0]]} is out of range for a dataset of {size} samples")
    return array


class RandomAccess:
    """Samples by global index, through the dataset's session (a base of ``StreamingDataset``)."""

    config: DatasetConfig
    sample_map: SampleMap
    session: NodeSession

    @property
    def size(self) -> int:
        """Underlying samples, summed over streams."""
        return self.sample_map.num_samples

    @property
    def num_samples(self) -> int:
        return self.sample_map.num_samples

    def get_item(self, index: int) -> dict[str, Any]:
        """Sample ``index`` as stored (MosaicML's hook for subclasses; iteration reads through it)."""
        held = read_inline(index)
        return held if held is not None else portal().call(self.session.read_sample(check_index(index, self.size)))

    def __getitem__(self, index: int | slice | list[Any] | np.ndarray[Any, Any]) -> Any:
        """Sample ``index``, ``transform`` applied (a subclass may override this, as with MosaicML);
        a slice, a list or an array of indexes gives a list of samples, each through ``self[i]``."""
        if isinstance(index, MANY):
            return [self[i] for i in sub_indexes(index, self.size)]
        sample = self.get_item(index)
        return sample if self.config.transform is None else self.config.transform(sample)

    def _steps(self) -> SampleSteps | None:
        """The per-sample path, where a transform or a subclass's override must see each sample."""
        base, cls = RandomAccess, type(self)
        if self.config.transform is None and cls.__getitem__ is base.__getitem__ and cls.get_item is base.get_item:
            return None
        return SampleSteps(self.__getitem__, self.sample_map.describe)

    async def aget(self, index: int) -> Any:
        """``ds[index]`` for async code: the user's code runs in an executor thread."""
        i, steps = check_index(index, self.size), self._steps()
        if steps is None:
            return await self.session.read_sample(i)
        return (await asyncio.get_running_loop().run_in_executor(None, steps.run, [i], _nothing_held))[0]

    async def aget_batch(self, ids: Sequence[int] | np.ndarray) -> dict[str, Any]:
        """Samples ``ids`` as one batch (dict of arrays/lists), fetching shards as needed."""
        return await self.session.read_batch(check_indexes(ids, self.size), self._steps())

    def get_batch(self, ids: Sequence[int] | np.ndarray) -> dict[str, Any]:
        return portal().call(self.aget_batch(ids))


def _nothing_held(index: int) -> None:
    """Random access holds no shard in advance: ``get_item`` fetches what it reads."""
    return None
