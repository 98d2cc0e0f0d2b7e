"""The ``py1e`` shuffle (MosaicML's default): shards spread over expanded ranges.

Inside each canonical node, every span's samples are shuffled, then each sample gets
its position jittered by a uniform shift whose range grows with ``block_size``, and the
node's samples are reordered by the jittered positions. A shard's samples thus end up
spread over about ``block_size`` positions around where the shard sits.

That reordering is an ``argsort`` of the node's positions: most of the shuffle's time
(~120 ms of ~165 for a node of 1M samples here). A resumed epoch wants only the node's
order from a position ``start`` on; from half the node on, only the largest ``len - start`` positions are
found (``argpartition``) and sorted. That is exactly the tail of the full ``argsort``
whenever the order there is unique: no two of those positions equal, and all above the
rest. Ties (degenerate cases only: the shifts are uniform doubles) fall back to the full
``argsort``, whose tie order MosaicML's matches.
"""

from __future__ import annotations

import warnings
from collections.abc import Collection, Mapping
from typing import Any

import numpy as np
import numpy.typing as npt

from astream._sampling.shuffle.draws import jitter_draws
from astream._sampling.shuffle.nodes import ShuffleParts, shuffle_nodes
from astream._sampling.shuffle.spans import Int64Array
from astream._sampling.warnings import SamplingWarning
from astream.errors import ConfigError

__all__ = ["py1e_parts"]


class _Py1e:
    """The generator calls are MosaicML's, in its order: per node, one ``shuffle`` per span,
    then per span one ``integers`` and one ``uniform(size=span)``, then ``argsort`` (NumPy's
    default kind, as MosaicML; ties only occur in degenerate cases).
    """

    def __init__(self, block_size: int) -> None:
        self.low, self.high = int(0.75 * block_size), int(1.25 * block_size)
        self.block_smaller_than_shard = False
        self.num_canonical_nodes = 0

    def before(self, rng: np.random.Generator, num_canonical_nodes: int) -> None:
        self.num_canonical_nodes = num_canonical_nodes

    def visit(self, rng: np.random.Generator, node: int, ids: Int64Array, span_sizes: list[int], kept: bool,
              start: int = 0) -> None:
        node_size = len(ids)
        if node_size == 0:
            raise _empty_node(node, self.num_canonical_nodes)
        offset = 0
        for size in span_sizes:
            if size > 1:
                rng.shuffle(ids[offset : offset + size])
            offset += size
        if not kept and jitter_draws(rng, span_sizes, self.low, self.high):
            # (the warning below is about the result: a node nobody keeps has none)
            return
        positions = np.arange(node_size, dtype=np.float64) if kept else None
        offset = 0
        for size in span_sizes:
            reach = int(rng.integers(self.low, self.high))
            cutoff = (reach - size) / 2
            if cutoff < 0:
                cutoff = 0.0
                self.block_smaller_than_shard = True
            # Same doubles as MosaicML's max/min over numpy scalars, hence the same shifts.
            lo = max(-cutoff, -offset)
            hi = min(cutoff, node_size - offset - size)
            shifts = rng.uniform(lo, hi, size)
            if positions is not None:
                positions[offset : offset + size] += shifts
            offset += size
        if positions is None:
            return
        # The partial sort pays when the tail is a small part of the node: its temporaries
        # (a partition, the tail's values, their order) would otherwise outgrow the full
        # sort's (at one canonical node of 10^8 samples: 5.7 GB against 2.4).
        tail = tail_order(positions, start) if node_size // 2 <= start < node_size else None
        if tail is not None:
            ids[start:] = ids[tail]  # (ids[:start] left as they are: not wanted)
            return
        order = np.argsort(positions)
        # Gather through the positions buffer (free after the argsort) to save a temporary.
        gathered = positions.view(np.int64)
        np.take(ids, order, out=gathered)
        ids[:] = gathered


def tail_order(positions: npt.NDArray[np.float64], start: int) -> Int64Array | None:
    """``np.argsort(positions)[start:]`` without sorting the rest, or None where a tie among
    those positions (or with the rest) would make the full sort's order matter.

    ``0 < start < len(positions)``.
    """
    part = np.argpartition(positions, start)
    tail = part[start:]
    values = positions[tail]
    order = np.argsort(values)
    ranked = values[order]
    if ranked.size > 1 and not bool((ranked[1:] > ranked[:-1]).all()):
        return None
    # The rest are at most ranked[0] (argpartition's promise): none may equal it.
    if int(np.count_nonzero(positions == ranked[0])) != 1:
        return None
    return tail[order]


def _empty_node(node: int, num_canonical_nodes: int) -> ConfigError:
    return ConfigError(
        f"canonical node {node} of {num_canonical_nodes} gets no sample: the stream "
        f"has fewer samples than num_canonical_nodes; reduce num_canonical_nodes"
    )


def py1e_parts(
    shard_sizes: Int64Array, num_canonical_nodes: int, seed: int, epoch: int, block_size: int,
    keep: Collection[int] | None = None, node_states: Mapping[int, dict[str, Any]] | None = None,
) -> ShuffleParts:
    """Return py1e's permutation for this epoch (whole, or the nodes in ``keep``).

    Raises:
        ConfigError: a canonical node gets no sample (fewer samples than canonical nodes).
    """
    total, c = int(shard_sizes.sum()), num_canonical_nodes
    if total < c:  # some node's slice [N*p//C, N*(p+1)//C) is empty: refused whatever is kept
        raise _empty_node(next(p for p in range(c) if total * p // c == total * (p + 1) // c), c)
    visitor = _Py1e(block_size)
    parts = shuffle_nodes(shard_sizes, num_canonical_nodes, seed, epoch, visitor, keep, node_states)
    if visitor.block_smaller_than_shard:
        warnings.warn(
            "shuffle_block_size is smaller than some shards (py1e): those shards are not mixed "
            "with their neighbours; raise shuffle_block_size for a better shuffle",
            SamplingWarning,
            stacklevel=4,
        )
    return parts
