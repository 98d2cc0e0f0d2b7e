"""Streams: how many samples each contributes per epoch, and which ones.

Two steps, as in MosaicML Streaming (spec sections 4.2 and 4.3):

- :func:`apply_weights`, once per dataset: turn each stream's ``proportion``, ``repeat`` or
  ``choose`` (and the dataset's ``epoch_size``) into an absolute ``choose`` per stream;
- :func:`resample`, once per epoch: spread each stream's ``choose`` over its shards
  (:func:`shard_counts`) and pick the samples of partial repeats, giving the *shuffle
  units* (what the shuffle sees as shards) and the map from epoch positions ("big" ids)
  to underlying sample ids ("small" ids).

Everything is vectorised except one ``Generator.choice`` per shard with a partial repeat,
which must stay a separate call to keep MosaicML's random stream.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import numpy.random  # numpy loads it lazily: with the module, not in the first epoch plan (~5 ms)
from numpy.typing import NDArray

from astream.errors import ConfigError

__all__ = [
    "Resampled",
    "StreamSpec",
    "StreamWeights",
    "apply_weights",
    "map_ids",
    "resample",
    "shard_counts",
    "stream_spec",
]

Int64Array = NDArray[np.int64]
Float64Array = NDArray[np.float64]


@dataclass(frozen=True)
class StreamSpec:
    """One stream as the planner sees it: its shard sizes and its (optional) weight.

    At most one of ``proportion``, ``repeat`` and ``choose`` may be set.
    """

    shard_sizes: Int64Array
    proportion: float | None = None
    repeat: float | None = None
    choose: int | None = None

    def __post_init__(self) -> None:
        given = [n for n in ("proportion", "repeat", "choose") if getattr(self, n) is not None]
        if len(given) > 1:
            raise ConfigError(
                f"a stream sets {' and '.join(given)}: give at most one of proportion, repeat or "
                f"choose; the others are derived"
            )
        for name in given:
            value = getattr(self, name)
            if isinstance(value, bool) or value < 0:
                raise ConfigError(f"stream {name} must be a non-negative number, got {value!r}")
        if self.choose is not None and int(self.choose) != self.choose:
            raise ConfigError(f"stream choose must be an integer, got {self.choose!r}")

    @property
    def num_samples(self) -> int:
        """Underlying samples of the stream."""
        return int(self.shard_sizes.sum())


@dataclass(frozen=True)
class StreamWeights:
    """The absolute weights every stream ends up with (MosaicML writes them back).

    Attributes:
        choose: samples drawn from each stream per epoch.
        proportion: each stream's share of the epoch (float64, as MosaicML computes it).
        repeat: ``choose / num_samples`` per stream.
        epoch_size: ``sum(choose)``.
    """

    choose: Int64Array
    proportion: Float64Array
    repeat: Float64Array
    epoch_size: int


def apply_weights(streams: Sequence[StreamSpec], epoch_size: int | None, seed: int) -> StreamWeights:
    """Derive every stream's ``choose`` from the weights given (MosaicML's ``apply_weights``).

    Relative weights (proportions, or none with an ``epoch_size``) give each stream
    ``floor(E * p)``; the shortfall goes +1 to streams drawn by ``default_rng(seed)``.

    Raises:
        ConfigError: proportions mixed with absolute weights, an ``epoch_size`` given with
            absolute weights, or an empty stream.
    """
    if not streams:
        raise ConfigError("streams must hold at least one stream")
    sizes = np.array([s.num_samples for s in streams], np.int64)
    for i, n in enumerate(sizes.tolist()):
        if n == 0:
            raise ConfigError(f"stream {i} has no samples; remove it or fix its index")
    relative = streams[0].proportion is not None
    for i, s in enumerate(streams):
        if (s.proportion is not None) != relative:
            raise ConfigError(
                f"stream {i}: relative (proportion) and absolute (repeat, choose, or none) stream "
                f"weights cannot be mixed; give proportion on every stream or on none"
            )
    unspecified = all(s.repeat is None and s.choose is None for s in streams)
    if relative or (unspecified and epoch_size):
        total = int(epoch_size) if epoch_size else int(sizes.sum())
        if relative:
            proportion = np.array([s.proportion for s in streams], np.float64)
            if not proportion.sum() > 0:
                raise ConfigError("stream proportions must not all be 0")
        else:
            proportion = sizes.astype(np.float64)
        proportion /= proportion.sum()
        choose = (total * proportion).astype(np.int64)
        shortfall = total - int(choose.sum())
        picked = np.random.default_rng(seed).choice(len(streams), shortfall, False)
        choose[picked] += 1
    else:
        if epoch_size:
            raise ConfigError(
                "epoch_size can only be given with relative stream weights (proportion) or no "
                "weights; with repeat or choose the epoch size is their sum"
            )
        values: list[int] = []
        for s, n in zip(streams, sizes.tolist(), strict=True):
            if s.repeat is not None:
                values.append(int(s.repeat * np.int64(n)))
            elif s.choose is not None:
                values.append(int(s.choose))
            else:
                values.append(n)
        choose = np.array(values, np.int64)
        total = int(choose.sum())
        if total == 0:
            raise ConfigError("the streams' repeat/choose weights draw no sample at all")
        proportion = choose / choose.sum()
    return StreamWeights(choose, proportion, choose / sizes, total)


def shard_counts(
    shard_sizes: Int64Array, choose: int, granularity: int, seed: int, epoch: int, use_epoch: bool
) -> Int64Array:
    """How many samples to draw from each shard of a stream (MosaicML's ``get_sampling``).

    Whole multiples of the stream need no randomness. Otherwise every shard first gets
    its whole repeats, and the remainder is filled by walking the shards' picks of
    ``granularity`` samples in the order ``default_rng(seed')`.permutation`` gives, with
    ``seed' = seed + epoch`` if ``use_epoch`` else ``seed``.
    """
    total = int(shard_sizes.sum())
    if choose % total == 0:
        return shard_sizes * (choose // total)
    picks_per_shard = (shard_sizes + granularity - 1) // granularity
    pick_shard = np.repeat(np.arange(len(shard_sizes)), picks_per_shard)
    pick_size = np.full(len(pick_shard), granularity, np.int64)
    # QUIRK (kept): an empty shard has no pick, yet MosaicML still writes its "last pick size"
    # (``granularity``) at index ``cumsum - 1``, i.e. over the previous shard's last pick (or,
    # for leading empty shards, index -1). NumPy applies duplicate indices in order, so the
    # same assignment reproduces which write wins.
    last = np.cumsum(picks_per_shard) - 1
    pick_size[last] = shard_sizes - (picks_per_shard - 1) * granularity
    order = np.random.default_rng(seed + epoch if use_epoch else seed).permutation(len(pick_shard))
    remainder = choose % total
    taken = np.cumsum(pick_size[order])
    # Picks before the one that reaches the remainder count whole; that one counts partly.
    end = int(np.searchsorted(taken, remainder, side="left"))
    amounts = pick_size[order[: end + 1]].copy()
    amounts[-1] -= int(taken[end]) - remainder
    counts = shard_sizes * (choose // total)
    counts += np.bincount(pick_shard[order[: end + 1]], amounts, len(shard_sizes)).astype(np.int64)
    return counts


@dataclass(frozen=True)
class Resampled:
    """One epoch's resampling of some streams.

    Attributes:
        units: sizes of the shuffle units (a shard once per whole repeat, plus its partial
            pick), empty shards left out as in MosaicML.
        small_per_big: underlying sample id of each epoch position, or ``None`` when every
            shard is drawn exactly once, so that the map is ``big + offset`` (no O(epoch)
            array then).
        offset: the constant of that map when ``small_per_big`` is ``None``.
    """

    units: Int64Array
    small_per_big: Int64Array | None
    offset: int = 0

    @property
    def size(self) -> int:
        """Positions in the resampled epoch."""
        return int(self.units.sum())

    def to_small(self, big: Int64Array) -> Int64Array:
        """Map positions (``-1`` kept) to underlying sample ids, in place."""
        if self.small_per_big is not None:
            map_ids(self.small_per_big, big)
        elif self.offset:
            big += np.where(big >= 0, self.offset, 0)
        return big


def map_ids(table: Int64Array, ids: Int64Array, chunk: int = 1 << 20) -> None:
    """``ids[:] = where(ids >= 0, table[ids], -1)`` in place, chunk by chunk (no O(N) temporaries).

    ``ids`` must be C-contiguous; ``np.take`` into the chunk it reads is safe because each
    entry is read before it is written.
    """
    flat = ids.reshape(-1)
    for lo in range(0, len(flat), chunk):
        part = flat[lo : lo + chunk]
        pad = part < 0
        np.take(table, part, out=part, mode="clip")
        part[pad] = -1


def resample(
    shard_sizes: Sequence[Int64Array],
    shard_offsets: Sequence[int],
    choose: Sequence[int],
    *,
    seed: int,
    epoch: int,
    granularity: int,
    balanced: bool,
    epoch_seed_change: bool,
) -> Resampled:
    """Resample the given streams for one epoch (MosaicML's ``resample_streams``).

    Args:
        shard_sizes: per stream, its shard sizes.
        shard_offsets: per stream, the global sample id of its first sample.
        choose: per stream, samples to draw this epoch.
        seed: the shuffle seed.
        epoch: the epoch.
        granularity: ``sampling_granularity``.
        balanced: ``sampling_method == 'balanced'``: partial repeats are drawn with
            ``default_rng(seed + epoch)``, else ``default_rng(seed)`` (whatever ``shuffle``).
        epoch_seed_change: ``shuffle and balanced``: whether per-shard counts vary by epoch.

    All streams passed share one generator for their partial repeats (MosaicML's
    ``random`` batching passes all streams; the other methods one stream per call).
    """
    rng = np.random.default_rng(seed + epoch if balanced else seed)
    all_sizes = np.concatenate(shard_sizes).astype(np.int64, copy=False)
    counts = np.concatenate([
        shard_counts(sizes, int(c), granularity, seed, epoch, epoch_seed_change)
        for sizes, c in zip(shard_sizes, choose, strict=True)
    ])
    starts = np.concatenate([
        off + np.cumsum(sizes) - sizes for sizes, off in zip(shard_sizes, shard_offsets, strict=True)
    ]).astype(np.int64)
    nonempty = all_sizes > 0
    if np.array_equal(counts, all_sizes):
        # Every shard drawn exactly once: positions map to ids by a constant offset.
        return Resampled(all_sizes[nonempty], None, int(shard_offsets[0]))
    safe = np.where(nonempty, all_sizes, 1)
    full = np.where(nonempty, counts // safe, 0)
    rest = np.where(nonempty, counts % safe, 0)
    # Units per shard: ``full`` copies of the shard, then the partial pick if any (never
    # an empty unit: MosaicML drops empty shards and zero counts from the units).
    per_shard = full + (rest > 0)
    shard_of_unit = np.repeat(np.arange(len(all_sizes)), per_shard)
    unit_end = np.cumsum(per_shard)
    is_partial = np.zeros(len(shard_of_unit), bool)
    is_partial[unit_end[rest > 0] - 1] = True
    units = np.where(is_partial, rest[shard_of_unit], all_sizes[shard_of_unit]).astype(np.int64)
    # A full unit counts up from its shard's first id: write each unit's jump from the
    # previous unit's last id, then integrate with one in-place cumsum.
    unit_start = np.cumsum(units) - units
    small = np.ones(int(units.sum()), np.int64)
    if len(small):
        first = starts[shard_of_unit]
        prev_last = np.concatenate([np.zeros(1, np.int64), (first + units - 1)[:-1]])
        small[unit_start] = first - prev_last
        np.cumsum(small, out=small)
    for shard, start in zip(np.flatnonzero(rest).tolist(), unit_start[is_partial].tolist(), strict=True):
        picked = rng.choice(int(all_sizes[shard]), int(rest[shard]), False)
        picked.sort()
        small[start : start + len(picked)] = picked + starts[shard]
    return Resampled(units, small, 0)


_STREAM_KEYS = {"shard_sizes", "proportion", "repeat", "choose"}


def stream_spec(stream: StreamSpec | Mapping[str, Any]) -> StreamSpec:
    """Accept a :class:`StreamSpec` or a mapping with ``shard_sizes`` and optional weights.

    Raises:
        ConfigError: unknown keys, missing or negative shard sizes, or conflicting weights.
    """
    if isinstance(stream, StreamSpec):
        return stream
    unknown = set(stream) - _STREAM_KEYS
    if unknown or "shard_sizes" not in stream:
        raise ConfigError(
            f"a stream is a mapping with 'shard_sizes' and optional 'proportion', 'repeat', "
            f"'choose'; got keys {sorted(stream)}"
        )
    sizes = np.asarray(stream["shard_sizes"], dtype=np.int64).reshape(-1)
    if (sizes < 0).any():
        raise ConfigError("shard_sizes must not be negative")
    return StreamSpec(sizes, stream.get("proportion"), stream.get("repeat"), stream.get("choose"))
