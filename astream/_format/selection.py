"""Fancy indexing of a dataset, as MosaicML's datasets take it: ``ds[[17, 44]]``,
``ds[0:29:3]``, ``ds[np.arange(10)]``, each a list of samples (lists of lists for nested
lists or a 2-D array). One rule for ``LocalDataset`` and ``StreamingDataset``: each
element goes back through the dataset's own ``__getitem__``, so a subclass's override and
a transform see one sample at a time.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any

import numpy as np

from astream.errors import ConfigError

__all__ = ["MANY", "sub_indexes"]

MANY = (slice, list, np.ndarray)
"""The index types that select several samples."""


def sub_indexes(index: slice | list[Any] | np.ndarray[Any, Any], size: int) -> Iterable[Any]:
    """What each element of a multi-sample ``index`` is: ints for a slice (Python's slice
    rules over ``range(size)``), the items of a list, the rows of an array."""
    if isinstance(index, slice):
        return range(size)[index]
    if isinstance(index, np.ndarray) and index.ndim == 0:
        raise ConfigError(f"a 0-d array is not a sample index: use int(index) ({index!r})")
    return index
