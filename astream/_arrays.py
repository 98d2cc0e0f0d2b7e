"""Small NumPy helpers for the paths that run before the first sample.

``np.unique`` imports ``numpy.ma`` on its first call (~6 ms with numpy 2.x), which would
land on the first batch of a process; these do the same with a sort and a comparison.
"""

from __future__ import annotations

from typing import Any, TypeVar, cast

import numpy as np
import numpy.typing as npt

__all__ = ["group_positions", "sorted_unique"]

A = TypeVar("A", bound=npt.NDArray[Any])


def sorted_unique(a: A) -> A:
    """The distinct values of a 1-D integer array, ascending (``np.unique(a)``)."""
    if len(a) == 0:
        return cast(A, a[:0].copy())
    s = np.sort(a, kind="stable")
    keep = np.empty(len(s), bool)
    keep[0] = True
    np.not_equal(s[1:], s[:-1], out=keep[1:])
    return cast(A, s[keep])


def group_positions(keys: A) -> tuple[A, list[npt.NDArray[np.intp]]]:
    """The distinct keys, ascending, and for each the positions where it occurs, in order."""
    order = np.argsort(keys, kind="stable")
    s = keys[order]
    cut = np.flatnonzero(s[1:] != s[:-1]) + 1
    firsts = np.empty(len(cut) + 1, np.intp)
    firsts[0] = 0
    firsts[1:] = cut
    # Slices, not np.split (which costs ~10 us for a handful of groups, per batch).
    ends = [*cut.tolist(), len(order)]
    groups = [order[a:b] for a, b in zip(firsts.tolist(), ends, strict=True)]
    return cast(A, s[firsts] if len(s) else s), groups
