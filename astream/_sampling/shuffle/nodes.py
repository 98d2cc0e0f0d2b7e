"""Canonical node by canonical node: the driver of the span-based shuffles, and its result.

py1b, py1br, py1e and py1s share a shape: after the span prefix (spans.py) they walk the
canonical nodes in order, each consuming random draws and permuting that node's slice of
the output. The draws must all be made, in order, for every node (one node's draws decide
where the next node's stream starts) but a generator's ``shuffle`` consumes draws that
depend only on the *length* shuffled. So a node whose result nobody needs is walked over
a scratch buffer: same draws, no O(node) result kept, and for py1e no ``argsort``. This is
what lets one worker compute its slice of the epoch without the whole shuffle. A node
may also be wanted from a position on (a resumed epoch reads only the rest of it): py1e
then orders only that part of the node (see :mod:`.py1e`).
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

import numpy as np
from numpy.lib.stride_tricks import as_strided

from astream._arrays import sorted_unique
from astream._sampling.shuffle.spans import Int64Array, epoch_spans, segment_arange

__all__ = ["NodeVisitor", "ShuffleParts", "shuffle_nodes"]


class NodeVisitor(Protocol):
    """One algorithm's per-node step."""

    def before(self, rng: np.random.Generator, num_canonical_nodes: int) -> None:
        """Draws made once, after the span prefix and before the first node."""

    def visit(self, rng: np.random.Generator, node: int, ids: Int64Array, span_sizes: list[int], kept: bool,
              start: int = 0) -> None:
        """Permute ``ids`` (the node's samples in span order) in place.

        When ``kept`` is false ``ids`` is scratch of the right length: make the same draws,
        skip any work whose only purpose is the result. Only ``ids[start:]`` of the result
        is wanted: a visitor may leave the positions before ``start`` unspecified.
        """


@dataclass
class ShuffleParts:
    """A shuffle, whole or only for some canonical nodes.

    Attributes:
        bounds: ``C + 1`` position bounds, node ``p`` owning ``[bounds[p], bounds[p+1])``.
        full: the whole permutation, when computed.
        parts: otherwise, the permutation's slice of each node computed.
        starts: per node of ``parts``, the first position (in the node) it holds; those
            before it are unspecified.
    """

    bounds: Int64Array
    full: Int64Array | None = None
    parts: dict[int, Int64Array] = field(default_factory=dict)
    starts: dict[int, int] = field(default_factory=dict)
    # The epoch generator's state where each canonical node's draws begin (those walked),
    # as ``BitGenerator.state``: given back to :func:`shuffle_nodes`, a later computation
    # of the same shuffle starts at its first wanted node without the draws before it.
    node_states: dict[int, dict[str, Any]] = field(default_factory=dict)

    def nodes_of(self, positions: Int64Array) -> Int64Array:
        """Canonical node owning each (non-negative) position."""
        return np.searchsorted(self.bounds, positions, side="right") - 1

    def map_positions(self, positions: Int64Array) -> None:
        """Replace positions by their shuffled ids, in place (``-1`` kept).

        Raises:
            KeyError: a position falls in a canonical node, or the part of one, that was
                not computed.
        """
        if self.full is not None:
            valid = positions >= 0
            positions[valid] = self.full[positions[valid]]
            return
        indices = np.flatnonzero(positions >= 0)
        nodes = self.nodes_of(positions[indices])
        for node in sorted_unique(nodes).tolist():
            where = indices[nodes == node]
            offsets = positions[where] - self.bounds[node]
            start = self.starts.get(node, 0)
            if start and int(offsets.min()) < start:
                raise KeyError(f"canonical node {node} was computed from position {start} on only")
            positions[where] = self.parts[node][offsets]


def shuffle_nodes(
    shard_sizes: Int64Array,
    num_canonical_nodes: int,
    seed: int,
    epoch: int,
    visitor: NodeVisitor,
    keep: Collection[int] | None = None,
    node_states: Mapping[int, dict[str, Any]] | None = None,
) -> ShuffleParts:
    """Run the span prefix, then ``visitor`` over every canonical node in order.

    Args:
        keep: canonical nodes whose slice is wanted; ``None`` for the whole permutation. A
            mapping gives each node's first position wanted (relative to the node).
        node_states: generator states where nodes' draws begin, from an earlier
            :attr:`ShuffleParts.node_states` of *this same shuffle* (algorithm, shard sizes,
            canonical nodes, seed, epoch, block): the nodes before a wanted node whose state
            is known are not walked. The caller keys them (a wrong state is a wrong order).
    """
    spans, rng, _ = epoch_spans(shard_sizes, num_canonical_nodes, seed, epoch)
    visitor.before(rng, num_canonical_nodes)
    sizes = spans.sizes
    span_bounds = spans.part_bounds.tolist()
    cum = np.concatenate([np.zeros(1, np.int64), np.cumsum(sizes, dtype=np.int64)])
    bounds = cum[spans.part_bounds]
    result = ShuffleParts(bounds)
    if keep is None:
        ids = segment_arange(spans.begins, spans.ends)
        for node in range(num_canonical_nodes):
            result.node_states[node] = dict(rng.bit_generator.state)
            lo, hi = span_bounds[node], span_bounds[node + 1]
            node_ids = ids[int(bounds[node]) : int(bounds[node + 1])]
            visitor.visit(rng, node, node_ids, sizes[lo:hi].tolist(), True)
        result.full = ids
        return result
    wanted = set(keep)
    known = node_states or {}
    starts = {int(k): int(v) for k, v in keep.items() if v > 0} if isinstance(keep, Mapping) else {}
    # A node nobody keeps is shuffled in one element seen through a zero stride: the same
    # draws (a shuffle's depend only on the length), no O(node) buffer, no cache misses.
    one = np.zeros(1, np.int64)
    scratch = as_strided(one, shape=(int(np.diff(bounds).max(initial=0)),), strides=(0,), writeable=True)
    later = sorted(wanted)
    node = 0
    while node < num_canonical_nodes:
        ahead = next((w for w in later if w >= node), None)
        if ahead is None:
            break  # no wanted node left: the rest's draws change nothing
        if ahead > node and ahead in known:
            node = ahead
            rng.bit_generator.state = known[ahead]
        result.node_states[node] = dict(rng.bit_generator.state)
        lo, hi = span_bounds[node], span_bounds[node + 1]
        if node in wanted:
            node_ids = segment_arange(spans.begins[lo:hi], spans.ends[lo:hi])
            start = starts.get(node, 0)
            visitor.visit(rng, node, node_ids, sizes[lo:hi].tolist(), True, start)
            result.parts[node] = node_ids
            if start:
                result.starts[node] = start
        else:
            length = int(bounds[node + 1] - bounds[node])
            visitor.visit(rng, node, scratch[:length], sizes[lo:hi].tolist(), False)
        node += 1
    if node < num_canonical_nodes:
        result.node_states[node] = dict(rng.bit_generator.state)
    return result
