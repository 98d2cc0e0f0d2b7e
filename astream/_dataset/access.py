"""Checks of the sample indexes that random access (``ds[i]``, ``get_batch``) takes."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from astream.errors import ConfigError, SampleIndexError

__all__ = ["check_index", "check_indexes"]


def check_index(index: object, size: int) -> int:
    """``index`` as a non-negative int below ``size`` (negative ones count from the end).

    Raises:
        ConfigError: not an integer.
        SampleIndexError: out of range.
    """
    if isinstance(index, (bool, np.bool_)) or not isinstance(index, (int, np.integer)):
        raise ConfigError(f"sample index must be an int, got {type(index).__name__}")
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
