"""The batching methods that merge per-stream partitions: ``per_stream``, ``stratified``,
``device_per_stream`` (spec section 4.7; ``random`` is the plain path in plan.py).

Each method receives ``stream_work(stream_id, num_nodes, batch_size)``: that stream's own
resampled, partitioned (with ``drop_first=0``), shuffled and id-mapped 5-D tensor. The
merging itself works on whole global batches and is O(epoch), like MosaicML's; the
resumption offset is applied by dropping whole global batches at the end.
"""

from __future__ import annotations

import logging
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import numpy as np
from numpy.typing import NDArray

from astream.errors import ConfigError

__all__ = ["MergeContext", "merge_device_per_stream", "merge_per_stream", "merge_stratified"]

Int64Array = NDArray[np.int64]
StreamWork = Callable[[int, int, int], Int64Array]
logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class MergeContext:
    """What every merge needs besides the per-stream tensors."""

    num_streams: int
    proportions: Sequence[float]
    nodes: int
    ranks: int
    workers: int
    batch: int
    num_canonical_nodes: int
    sample_in_epoch: int
    label_seed: int  # seed + epoch when the seed changes per epoch, else seed

    @property
    def global_batch(self) -> int:
        return self.batch * self.ranks * self.nodes


def _traversal(work: Int64Array) -> Int64Array:
    """Flatten a 5-D tensor in the order training consumes it (batch, worker, node, rank)."""
    return np.asarray(work.transpose(3, 2, 0, 1, 4).reshape(-1), np.int64)


def _place_by_label(counts: Sequence[int], rng: np.random.Generator) -> Int64Array:
    """Shuffle one stream label per item; return, per slot, the index of the item it gets.

    Each stream's items keep their own order; they fill the slots labelled with the stream.
    """
    labels = np.repeat(np.arange(len(counts)), counts)
    rng.shuffle(labels)
    index = np.zeros(len(labels), np.int64)
    offset = 0
    for stream, count in enumerate(counts):
        index[labels == stream] = offset + np.arange(count)
        offset += count
    return index


def _finish(batches: Int64Array, ctx: MergeContext) -> Int64Array:
    """Resume after whole global batches, pad with -1 batches, reshape to 5-D."""
    g = ctx.global_batch
    if ctx.sample_in_epoch % g:
        logger.warning(
            "sample_in_epoch=%d is not a multiple of the global batch %d: resuming after the last "
            "complete global batch", ctx.sample_in_epoch, g,
        )
    batches = batches[ctx.sample_in_epoch // g :]
    unit = g * ctx.workers
    missing = (-batches.size) % unit
    if missing:
        batches = np.concatenate([batches, np.full((missing // g, g), -1, np.int64)])
    shaped = batches.reshape(-1, ctx.workers, ctx.nodes, ctx.ranks, ctx.batch)
    return np.ascontiguousarray(shaped.transpose(2, 3, 1, 0, 4))


def merge_per_stream(stream_work: StreamWork, ctx: MergeContext) -> Int64Array:
    """Every global batch comes from one stream; the streams' batches are interleaved at random."""
    g = ctx.global_batch
    kept: list[Int64Array] = []
    counts: list[int] = []
    for stream in range(ctx.num_streams):
        rows = _traversal(stream_work(stream, ctx.nodes, ctx.batch)).reshape(-1, g)
        full = int(np.count_nonzero(rows.min(axis=1) >= 0)) if len(rows) else 0
        if full != len(rows):
            logger.warning("per_stream batching drops incomplete global batches of stream %d", stream)
        if full == 0:
            raise ConfigError(
                f"stream {stream} has too few samples for one complete global batch of {g} "
                f"(batching_method='per_stream'); lower batch_size or raise its weight"
            )
        kept.append(rows[:full])
        counts.append(full)
    order = _place_by_label(counts, np.random.default_rng(ctx.label_seed))
    return _finish(np.concatenate(kept)[order], ctx)


def _stratified_portions(ctx: MergeContext) -> Int64Array:
    """Samples of each stream in every global batch, rounding up the largest remainders."""
    g = ctx.global_batch
    share = np.array(ctx.proportions, np.float64)
    portions = np.array([int(p * g) for p in share], np.int64)
    missing = g - int(portions.sum())
    if missing:
        leftover = g * share - portions
        portions[np.flip(np.argsort(leftover))[:missing]] += 1
    for stream, portion in enumerate(portions.tolist()):
        if portion <= 0:
            raise ConfigError(
                f"stream {stream} gets {portion} samples of each global batch of {g} "
                f"(batching_method='stratified'); raise the global batch size or its proportion"
            )
    return portions


def merge_stratified(stream_work: StreamWork, ctx: MergeContext) -> Int64Array:
    """Every global batch holds a fixed number of samples of each stream, in stream order."""
    portions = _stratified_portions(ctx).tolist()
    parts: list[Int64Array] = []
    for stream, portion in enumerate(portions):
        flat = _traversal(stream_work(stream, 1, 1))
        missing = (-flat.size) % portion
        if missing:
            flat = np.concatenate([flat, np.full(missing, -1, np.int64)])
        rows = flat.reshape(-1, portion)
        full = int(np.count_nonzero(rows.min(axis=1) >= 0)) if len(rows) else 0
        if full != len(rows):
            logger.warning("stratified batching drops incomplete batch parts of stream %d", stream)
        parts.append(rows)
    # Every stream is clipped to the fewest complete parts (MosaicML clips by count, so a
    # stream's clipped rows are its first rows, as here).
    least = min(int(np.count_nonzero(r.min(axis=1) >= 0)) if len(r) else 0 for r in parts)
    return _finish(np.concatenate([r[:least] for r in parts], axis=1), ctx)


def merge_device_per_stream(stream_work: StreamWork, ctx: MergeContext) -> Int64Array:
    """Every device batch comes from one stream; each node mixes its streams at random."""
    c, p, b = ctx.num_canonical_nodes, ctx.nodes, ctx.batch
    if c % p:
        raise ConfigError(
            f"batching_method='device_per_stream' needs num_canonical_nodes ({c}) divisible by "
            f"num_physical_nodes ({p})"
        )
    works = [stream_work(stream, c, 1) for stream in range(ctx.num_streams)]
    per_node = c // p
    node_batches: list[list[Int64Array]] = []
    node_counts: list[list[int]] = []
    for node in range(p):
        batches: list[Int64Array] = []
        counts: list[int] = []
        for stream, work in enumerate(works):
            flat = _traversal(work[node * per_node : (node + 1) * per_node])
            # QUIRK: MosaicML pads by ``b - size % b``, a whole -1 batch when divisible.
            flat = np.concatenate([flat, np.full(b - flat.size % b, -1, np.int64)])
            rows = flat.reshape(-1, b)
            full = int(np.count_nonzero(rows.min(axis=1) >= 0))
            if full != len(rows):
                logger.warning("device_per_stream batching drops incomplete batches of stream %d", stream)
            if full == 0:
                raise ConfigError(
                    f"stream {stream} has too few samples for one device batch of {b} on node "
                    f"{node} (batching_method='device_per_stream'); lower batch_size"
                )
            batches.append(rows[:full])
            counts.append(full)
        node_batches.append(batches)
        node_counts.append(counts)
    devices = p * ctx.ranks
    longest = max(sum(counts) for counts in node_counts)
    # QUIRK: always at least one group of padding, even when already divisible.
    longest += devices - longest % devices
    rng = np.random.default_rng(ctx.label_seed)
    merged: list[Int64Array] = []
    for batches, counts in zip(node_batches, node_counts, strict=True):
        rows = np.concatenate(batches)[_place_by_label(counts, rng)]
        merged.append(np.concatenate([rows, np.full((longest - len(rows), b), -1, np.int64)]))
    interleaved = np.stack(merged, axis=1).reshape(-1, ctx.global_batch)
    return _finish(interleaved, ctx)
