"""Default collation: a list of sample dicts -> one dict of NumPy arrays per column.

Columns whose values share a dtype and shape are stacked into one array; ``str``,
``bytes``, ragged arrays and other Python objects stay as lists (a batch of strings as
an object array helps nobody). The vectorised reader (``get_batch``) already returns
this shape for whole batches; this function is the fallback for samples read one by
one and for custom datasets.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np

__all__ = ["collate_samples", "concat_batches"]

_NUMERIC_SCALARS = (int, float, bool, np.generic)


def _collate_column(values: list[Any]) -> np.ndarray | list[Any]:
    first = values[0]
    if isinstance(first, np.ndarray):
        shape, dtype = first.shape, first.dtype
        if all(isinstance(v, np.ndarray) and v.shape == shape and v.dtype == dtype for v in values):
            return np.stack(values)
        return values
    if isinstance(first, _NUMERIC_SCALARS) and not isinstance(first, (str, bytes)):
        kind = type(first)
        if all(type(v) is kind for v in values):
            # Python ints beyond 64 bits would make an object array; keep those as a list.
            try:
                array = np.asarray(values)
            except OverflowError:
                return values
            return values if array.dtype == object else array
    return values


def collate_samples(samples: Sequence[dict[str, Any]]) -> dict[str, np.ndarray | list[Any]]:
    """Collate samples (dicts with the same keys) column by column."""
    if not samples:
        return {}
    return {key: _collate_column([s[key] for s in samples]) for key in samples[0]}


def concat_batches(parts: Sequence[dict[str, np.ndarray | list[Any]]]) -> dict[str, np.ndarray | list[Any]]:
    """Join batches (for example, the pieces of one batch read from several shards)."""
    if len(parts) == 1:
        return parts[0]
    out: dict[str, np.ndarray | list[Any]] = {}
    for key in parts[0]:
        columns = [p[key] for p in parts]
        if all(isinstance(c, np.ndarray) for c in columns):
            arrays = [c for c in columns if isinstance(c, np.ndarray)]
            if len({(a.shape[1:], a.dtype) for a in arrays}) == 1:
                out[key] = np.concatenate(arrays)
                continue
        joined: list[Any] = []
        for c in columns:
            joined.extend(list(c))
        out[key] = joined
    return out
