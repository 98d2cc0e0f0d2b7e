"""One batch whose samples lie in several shards (a shuffled batch), read in one pass.

A shuffled batch of 32 small records typically touches as many shards as the shuffle
block mixes (six or seven of 64 MB shards for 50,000 records of 1 KB): decoding each
shard's part and scattering the parts back into order costs a decode and a Python
loop per shard and column, which made a shuffled epoch of small records run at a
third of the unshuffled one. Here, when every shard holds the same all-fixed-size
records, each shard's records are copied once, by one fancy-indexed ``take``, straight
into their rows of one ``(batch, record)`` array, and the columns are decoded from it
once, as views: the same work as a batch from one shard. Other batches are decoded per
shard and put back in order with one permutation per list column.
"""

from __future__ import annotations

import itertools
import operator
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from astream._format.record import RecordLayout
from astream._format.shard import ShardReader, decode_rows
from astream.errors import ConfigError

__all__ = ["BatchSource", "common_fixed_layout", "gather_batch", "take_rows"]

Positions = npt.NDArray[np.intp]


class BatchSource(Protocol):
    """What a batch can be read from: a shard, or records fetched ahead of it."""

    def get_batch(self, ids: Any) -> dict[str, Any]: ...


def gather_batch(
    sources: Sequence[BatchSource], positions: Sequence[Positions], offsets: Sequence[npt.NDArray[np.int64]],
    size: int, where: str,
) -> dict[str, Any]:
    """The batch of ``size`` samples whose part ``k`` is records ``offsets[k]`` of ``sources[k]``.

    ``positions[k]`` are the places of part ``k`` in the batch (together, every place
    once); ``offsets`` must be valid record indexes. ``where`` names the data in errors.
    """
    layout = common_fixed_layout(sources)
    if layout is not None:
        # Each part is taken into consecutive rows (one take, no scatter per shard), then
        # the rows are put in batch order by one scatter: a numpy call per shard, not two.
        grouped = take_rows(sources, offsets, layout)
        rows = np.empty_like(grouped)
        rows[np.concatenate(positions)] = grouped
        # Only error messages name the samples: in the parts' order is enough.
        return decode_rows(layout, rows, where, np.concatenate(offsets))
    parts = [source.get_batch(idx) for source, idx in zip(sources, offsets, strict=True)]
    _check_same_columns(parts, where)
    return _scatter(parts, positions, size)


def _check_same_columns(parts: list[dict[str, Any]], where: str) -> None:
    """Refuse a batch whose parts have different columns (streams written differently).

    Collated from the first part's names alone, a column only some parts have would be
    dropped without a word, or fail as a bare KeyError.
    """
    names = [sorted(part) for part in parts]
    if any(n != names[0] for n in names[1:]):
        kinds = sorted({tuple(n) for n in names})
        raise ConfigError(
            f"one batch of {where} takes samples with different columns: "
            + "; ".join(str(list(k)) for k in kinds)
            + ". Give every stream the same columns, or iterate the dataset's samples "
            "(`for sample in dataset`) and batch them yourself"
        )


def take_rows(
    sources: Sequence[BatchSource], offsets: Sequence[npt.NDArray[np.int64]], layout: RecordLayout,
    scratch: npt.NDArray[np.uint8] | None = None,
) -> npt.NDArray[np.uint8]:
    """The records ``offsets[k]`` of every shard ``sources[k]``, part after part, as rows.

    The shards share ``layout``, of fixed-size records (:func:`common_fixed_layout`). The
    rows are written into the start of ``scratch`` (flat uint8) if it is large enough.
    """
    shape = (sum(len(idx) for idx in offsets), layout.fixed_size)
    size = shape[0] * shape[1]
    if scratch is not None and scratch.size >= size:
        grouped = scratch[:size].reshape(shape)
    else:
        grouped = np.empty(shape, np.uint8)
    start = 0
    for source, idx in zip(sources, offsets, strict=True):
        assert isinstance(source, ShardReader)
        source.copy_rows(idx, grouped[start : start + len(idx)])
        start += len(idx)
    return grouped


def common_fixed_layout(sources: Sequence[BatchSource]) -> RecordLayout | None:
    """The layout all ``sources`` share if they are shards of fixed-size records, else None."""
    first = sources[0] if sources else None
    if not isinstance(first, ShardReader) or first.layout.num_var:
        return None
    layout = first.layout
    for source in sources[1:]:
        if not isinstance(source, ShardReader) or not layout.same_columns(source.layout):
            return None
    return layout


def _scatter(parts: list[dict[str, Any]], positions: Sequence[Positions], size: int) -> dict[str, Any]:
    """Put per-shard pieces of a batch back into batch order."""
    out: dict[str, Any] = {}
    order = np.concatenate(positions) if positions else np.zeros(0, np.intp)
    pick: Callable[[list[Any]], Any] | None = None  # the concatenated parts' items in batch order
    for name in parts[0] if parts else ():
        values = [part[name] for part in parts]
        if all(isinstance(v, np.ndarray) for v in values) and len({(v.shape[1:], v.dtype) for v in values}) == 1:
            first = values[0]
            column = np.empty((size, *first.shape[1:]), first.dtype)
            for at, v in zip(positions, values, strict=True):
                column[at] = v
            out[name] = column
            continue
        if pick is None:
            # The positions cover every place once: the inverse permutation is a scatter,
            # not a sort, and itemgetter picks the items in one C loop.
            inverse = np.empty(len(order), np.intp)
            inverse[order] = np.arange(len(order))
            pick = operator.itemgetter(*inverse.tolist()) if len(order) > 1 else lambda items: tuple(items)
        out[name] = list(pick(list(itertools.chain.from_iterable(values))))
    return out
