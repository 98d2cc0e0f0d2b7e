"""The one-pass shuffles that keep shards contiguous: ``py1s``, ``py1b`` and ``py1br``.

All three start from :func:`~astream._sampling.shuffle.spans.epoch_spans` (run-wide shard
order, cut at canonical-node boundaries, per-epoch span order inside each node) and lay
the spans out in that order. They then differ in what they shuffle in place:

- ``py1s``: each span on its own (the block size is ignored);
- ``py1b``: fixed blocks of ``block_size`` positions inside each canonical node (the
  legacy algorithm, dropped by MosaicML after 0.9.1, still named by old checkpoints);
- ``py1br``: blocks of random size in ``[0.75, 1.25) * block_size``, staggered per node.

Every in-place shuffle is a ``Generator.shuffle`` of an int64 slice, the same call
MosaicML makes, so only the Python bookkeeping around the C loops is ours.
"""

from __future__ import annotations

import numpy as np

from astream._sampling.shuffle.spans import Int64Array, epoch_spans, segment_arange

__all__ = ["shuffle_py1b", "shuffle_py1br", "shuffle_py1s"]


def shuffle_py1s(
    shard_sizes: Int64Array, num_canonical_nodes: int, seed: int, epoch: int, block_size: int
) -> Int64Array:
    """Shuffle each span's samples in place, spans in epoch order."""
    del block_size  # py1s shuffles shard by shard
    spans, rng, _ = epoch_spans(shard_sizes, num_canonical_nodes, seed, epoch)
    ids = segment_arange(spans.begins, spans.ends)
    sizes = spans.sizes
    offsets = np.cumsum(sizes) - sizes
    for offset, size in zip(offsets.tolist(), sizes.tolist(), strict=True):
        if size > 1:  # a shuffle of fewer than two items draws nothing
            rng.shuffle(ids[offset : offset + size])
    return ids


def shuffle_py1b(
    shard_sizes: Int64Array, num_canonical_nodes: int, seed: int, epoch: int, block_size: int
) -> Int64Array:
    """Shuffle fixed blocks of ``block_size`` positions, restarting at each canonical node."""
    spans, rng, _ = epoch_spans(shard_sizes, num_canonical_nodes, seed, epoch)
    ids = segment_arange(spans.begins, spans.ends)
    node_ends = _node_sample_ends(spans.sizes, spans.part_bounds)
    node_start = 0
    for node_end in node_ends.tolist():
        for start in range(node_start, node_end, block_size):
            stop = min(start + block_size, node_end)
            if stop - start > 1:
                rng.shuffle(ids[start:stop])
        node_start = node_end
    return ids


def shuffle_py1br(
    shard_sizes: Int64Array, num_canonical_nodes: int, seed: int, epoch: int, block_size: int
) -> Int64Array:
    """Shuffle randomly sized, staggered blocks inside each canonical node.

    QUIRK (kept on purpose, MosaicML does the same): the cursor that places the blocks
    advances by each block's *clipped* length while the blocks are drawn back by the
    node's stagger, so the second block overlaps the first by ``stagger`` positions and
    the last ``<= stagger`` positions of a node can stay unshuffled.
    """
    spans, rng, _ = epoch_spans(shard_sizes, num_canonical_nodes, seed, epoch)
    ids = segment_arange(spans.begins, spans.ends)
    low, high = int(0.75 * block_size), int(1.25 * block_size)
    stagger = rng.integers(0, low, (num_canonical_nodes,)).tolist()
    node_ends = _node_sample_ends(spans.sizes, spans.part_bounds)
    node_start = 0
    for node, node_end in enumerate(node_ends.tolist()):
        blocks: list[tuple[int, int]] = []
        cursor = node_start
        shift = stagger[node]
        while cursor < node_end:
            size = int(rng.integers(low, high))
            start = max(cursor - shift, node_start)
            stop = min(cursor + size - shift, node_end)
            blocks.append((start, stop))
            cursor += stop - start
        for start, stop in blocks:
            if stop - start > 1:
                rng.shuffle(ids[start:stop])
        node_start = node_end
    return ids


def _node_sample_ends(sizes: Int64Array, part_bounds: Int64Array) -> Int64Array:
    """Position one past the last sample of each canonical node."""
    cum = np.concatenate([np.zeros(1, np.int64), np.cumsum(sizes, dtype=np.int64)])
    return cum[part_bounds[1:]]
