"""The one-pass shuffles that keep shards contiguous: ``py1s``, ``py1b`` and ``py1br``.

All three start from the span prefix (run-wide shard order, cut at canonical-node
boundaries, per-epoch span order inside each node) and lay the spans out in that order.
They then differ in what they shuffle in place, node by node:

- ``py1s``: each span on its own (the block size is ignored);
- ``py1b``: fixed blocks of ``block_size`` positions inside each canonical node (the
  legacy algorithm, dropped by MosaicML after 0.9.1, still named by old checkpoints);
- ``py1br``: blocks of random size in ``[0.75, 1.25) * block_size``, staggered per node.

Every in-place shuffle is a ``Generator.shuffle`` of an int64 slice, the same call
MosaicML makes, so only the Python bookkeeping around the C loops is ours.
"""

from __future__ import annotations

from collections.abc import Collection, Mapping
from typing import Any

import numpy as np

from astream._sampling.shuffle.nodes import ShuffleParts, shuffle_nodes
from astream._sampling.shuffle.spans import Int64Array

__all__ = ["py1b_parts", "py1br_parts", "py1s_parts"]


def _shuffle_runs(rng: np.random.Generator, ids: Int64Array, lengths: list[int]) -> None:
    """Shuffle consecutive runs of ``ids`` of these lengths, in order."""
    offset = 0
    for length in lengths:
        if length > 1:  # a shuffle of fewer than two items draws nothing
            rng.shuffle(ids[offset : offset + length])
        offset += length


class _Py1s:
    def before(self, rng: np.random.Generator, num_canonical_nodes: int) -> None:
        pass

    def visit(self, rng: np.random.Generator, node: int, ids: Int64Array, span_sizes: list[int], kept: bool,
              start: int = 0) -> None:
        _shuffle_runs(rng, ids, span_sizes)


class _Py1b:
    def __init__(self, block_size: int) -> None:
        self.block = block_size

    def before(self, rng: np.random.Generator, num_canonical_nodes: int) -> None:
        pass

    def visit(self, rng: np.random.Generator, node: int, ids: Int64Array, span_sizes: list[int], kept: bool,
              start: int = 0) -> None:
        for start in range(0, len(ids), self.block):
            if len(ids) - start > 1 and self.block > 1:
                rng.shuffle(ids[start : start + self.block])


class _Py1br:
    """QUIRK (kept on purpose, MosaicML does the same): the cursor that places the blocks
    advances by each block's *clipped* length while the blocks are drawn back by the
    node's stagger, so the second block overlaps the first by ``stagger`` positions and
    the last ``<= stagger`` positions of a node can stay unshuffled.
    """

    def __init__(self, block_size: int) -> None:
        self.low, self.high = int(0.75 * block_size), int(1.25 * block_size)
        self.stagger: list[int] = []

    def before(self, rng: np.random.Generator, num_canonical_nodes: int) -> None:
        self.stagger = rng.integers(0, self.low, (num_canonical_nodes,)).tolist()

    def visit(self, rng: np.random.Generator, node: int, ids: Int64Array, span_sizes: list[int], kept: bool,
              start: int = 0) -> None:
        end, shift = len(ids), self.stagger[node]
        blocks: list[tuple[int, int]] = []
        cursor = 0
        while cursor < end:
            size = int(rng.integers(self.low, self.high))
            start = max(cursor - shift, 0)
            stop = min(cursor + size - shift, end)
            blocks.append((start, stop))
            cursor += stop - start
        for start, stop in blocks:
            if stop - start > 1:
                rng.shuffle(ids[start:stop])


def py1s_parts(
    shard_sizes: Int64Array, num_canonical_nodes: int, seed: int, epoch: int, block_size: int,
    keep: Collection[int] | None = None, node_states: Mapping[int, dict[str, Any]] | None = None,
) -> ShuffleParts:
    """py1s: shuffle each span's samples in place, spans in epoch order."""
    return shuffle_nodes(shard_sizes, num_canonical_nodes, seed, epoch, _Py1s(), keep, node_states)


def py1b_parts(
    shard_sizes: Int64Array, num_canonical_nodes: int, seed: int, epoch: int, block_size: int,
    keep: Collection[int] | None = None, node_states: Mapping[int, dict[str, Any]] | None = None,
) -> ShuffleParts:
    """py1b: shuffle fixed blocks of ``block_size`` positions, restarting at each node."""
    return shuffle_nodes(shard_sizes, num_canonical_nodes, seed, epoch, _Py1b(block_size), keep, node_states)


def py1br_parts(
    shard_sizes: Int64Array, num_canonical_nodes: int, seed: int, epoch: int, block_size: int,
    keep: Collection[int] | None = None, node_states: Mapping[int, dict[str, Any]] | None = None,
) -> ShuffleParts:
    """py1br: shuffle randomly sized, staggered blocks inside each canonical node."""
    return shuffle_nodes(shard_sizes, num_canonical_nodes, seed, epoch, _Py1br(block_size), keep, node_states)
