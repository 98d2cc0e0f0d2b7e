"""The ``py1e`` shuffle (MosaicML's default): shards spread over expanded ranges.

Inside each canonical node, every span's samples are shuffled, then each sample gets
its position jittered by a uniform shift whose range grows with ``block_size``, and the
node's samples are reordered by the jittered positions. A shard's samples thus end up
spread over about ``block_size`` positions around where the shard sits.
"""

from __future__ import annotations

import warnings

import numpy as np

from astream._sampling.shuffle.spans import Int64Array, epoch_spans, segment_arange
from astream._sampling.warnings import SamplingWarning
from astream.errors import ConfigError

__all__ = ["shuffle_py1e"]


def shuffle_py1e(
    shard_sizes: Int64Array, num_canonical_nodes: int, seed: int, epoch: int, block_size: int
) -> Int64Array:
    """Return py1e's permutation for this epoch.

    The generator calls are MosaicML's, in its order: per node, one ``shuffle`` per span,
    then per span one ``integers`` and one ``uniform(size=span)``, then ``argsort`` (NumPy's
    default kind, as MosaicML; ties only occur in degenerate cases).

    Raises:
        ConfigError: a canonical node gets no sample (fewer samples than canonical nodes).
    """
    spans, rng, _ = epoch_spans(shard_sizes, num_canonical_nodes, seed, epoch)
    ids = segment_arange(spans.begins, spans.ends)
    sizes = spans.sizes
    bounds = spans.part_bounds.tolist()
    low, high = int(0.75 * block_size), int(1.25 * block_size)
    block_smaller_than_shard = False
    node_start = 0
    for node in range(num_canonical_nodes):
        node_sizes = sizes[bounds[node] : bounds[node + 1]].tolist()
        node_size = sum(node_sizes)
        if node_size == 0:
            raise ConfigError(
                f"canonical node {node} of {num_canonical_nodes} gets no sample: the stream has "
                f"fewer samples than num_canonical_nodes; reduce num_canonical_nodes"
            )
        node_ids = ids[node_start : node_start + node_size]
        offset = 0
        for size in node_sizes:
            if size > 1:
                rng.shuffle(node_ids[offset : offset + size])
            offset += size
        positions = np.arange(node_size, dtype=np.float64)
        offset = 0
        for size in node_sizes:
            reach = int(rng.integers(low, high))
            cutoff = (reach - size) / 2
            if cutoff < 0:
                cutoff = 0.0
                block_smaller_than_shard = True
            # Same doubles as MosaicML's max/min over numpy scalars, hence the same shifts.
            lo = max(-cutoff, -offset)
            hi = min(cutoff, node_size - offset - size)
            positions[offset : offset + size] += rng.uniform(lo, hi, size)
            offset += size
        order = np.argsort(positions)
        # Gather through the positions buffer (free after the argsort) to save a temporary.
        gathered = positions.view(np.int64)
        np.take(node_ids, order, out=gathered)
        node_ids[:] = gathered
        del positions, order, gathered
        node_start += node_size
    if block_smaller_than_shard:
        warnings.warn(
            "shuffle_block_size is smaller than some shards (py1e): those shards are not mixed "
            "with their neighbours; raise shuffle_block_size for a better shuffle",
            SamplingWarning,
            stacklevel=3,
        )
    return ids
