"""The mixture history in a resumable state, and what a resume under another mixture does.

A state records, besides MosaicML's five keys, the mixtures of its epoch under
``astream_mixtures``: each stream once (its key: digests of its shards and of where it
lives; its shard sizes run-length encoded: a removed stream's plan must still be
recomputed), and per mixture its weights, ``epoch_size`` and the sample it took over at.
No per-sample list: what each mixture delivered is recomputed from the plans
(:mod:`astream._sampling.remix`). The record of an epoch whose mixture never changed is
one mixture starting at 0; MosaicML's keys are untouched.

:func:`continue_history` is the one decision a ``load_state_dict`` makes about a changed
mixture (``on_mixture_change``): refuse it, or append the dataset's mixture at the state's
position. The plan follows from the history alone, so every rank and worker agrees. :func:`align` first
finds the state's streams among the dataset's.
"""

from __future__ import annotations

import json
import os
from collections.abc import Hashable, Mapping, MutableMapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

import numpy as np
import numpy.typing as npt
import xxhash

from astream._sampling.options import PlanOptions
from astream._sampling.plan import EpochPlan
from astream._sampling.remix import Mixture, RemainderPlan, Seen, mixed_plan, seen_before
from astream._sampling.streams import StreamSpec
from astream.errors import StateError

__all__ = [
    "MIXTURE_KEY",
    "MixtureEntry",
    "MixtureHistory",
    "StreamEntry",
    "align",
    "continue_history",
    "mixture_report",
    "pack_seen",
    "plan_changed",
    "stream_key",
    "unpack_seen",
]

MIXTURE_KEY = "astream_mixtures"
WEIGHTS = ("proportion", "repeat", "choose")


def stream_key(shard_identities: Sequence[Sequence[Any]], place: str) -> str:
    """A stream's key across mixtures: a digest of its shards (names, sample counts, bytes)
    and where it lives (see :func:`align`)."""
    return xxhash.xxh64(json.dumps([list(s) for s in shard_identities]).encode()).hexdigest() + "@" + place


def place_digest(where: str, split: str | None) -> str:
    """A digest of where a stream lives (never the URL itself: it may carry a token); a local
    path counts absolute, so that ``./web`` and ``/data/web`` are one place."""
    if "://" not in where:
        where = os.path.abspath(where)
    return xxhash.xxh64(f"{where.rstrip('/')}|{split or ''}".encode()).hexdigest()[:8]


@dataclass(frozen=True)
class StreamEntry:
    """One stream as a state records it (once, however many mixtures hold it)."""

    key: str
    place: str
    # (an array: at a million shards a tuple of ints was ~36 MB of objects in every rank)
    shard_sizes: npt.NDArray[np.int64]
    name: str = ""  # how messages name it: only known for the dataset's own streams

    @property
    def content(self) -> str:
        """The digest of its shards alone (the key without the place)."""
        return self.key.split("@", 1)[0]

    def to_dict(self) -> dict[str, Any]:
        sizes = np.asarray(self.shard_sizes, np.int64)
        # Runs of equal sizes, [size, count] each (a writer's shards are mostly alike).
        starts = np.flatnonzero(np.r_[True, sizes[1:] != sizes[:-1]]) if len(sizes) else np.zeros(0, np.int64)
        counts = np.diff(np.r_[starts, len(sizes)])
        return {"place": self.place, "shards": [[s, c] for s, c in zip(sizes[starts].tolist(), counts.tolist(),
                                                                      strict=True)]}

    @classmethod
    def from_dict(cls, key: str, obj: Any) -> StreamEntry:
        try:
            runs = [(int(size), int(count)) for size, count in obj["shards"]]
            sizes = np.repeat(np.array([r[0] for r in runs], np.int64),
                              np.maximum(0, np.array([r[1] for r in runs], np.int64)))
            place = str(obj["place"])
        except (KeyError, TypeError, ValueError, OverflowError) as exc:
            raise StateError(f"state key {MIXTURE_KEY!r}: stream {key} is malformed ({exc!r})") from exc
        if (sizes < 0).any() or not sizes.sum():
            raise StateError(f"state key {MIXTURE_KEY!r}: stream {key} has no samples or negative shard sizes")
        return cls(key, place, sizes)


@dataclass(frozen=True)
class MixtureEntry:
    """One mixture: its streams' keys and given weights, its ``epoch_size``, where it began."""

    keys: tuple[str, ...]
    weights: tuple[tuple[str | None, float | int | None], ...]
    epoch_size: int | None
    start: int = 0

    def same_mixture(self, other: MixtureEntry) -> bool:
        return (self.keys, self.weights, self.epoch_size) == (other.keys, other.weights, other.epoch_size)

    def to_dict(self, index: Mapping[str, int]) -> dict[str, Any]:
        return {"from": self.start, "epoch_size": self.epoch_size,
                "weights": [[index[k], kind, value] for k, (kind, value) in zip(self.keys, self.weights, strict=True)]}

    @classmethod
    def from_dict(cls, obj: Any, keys: Sequence[str]) -> MixtureEntry:
        try:
            start, size = obj["from"], obj["epoch_size"]
            rows = [(keys[i], kind, value) for i, kind, value in obj["weights"]]
        except (KeyError, TypeError, ValueError, IndexError) as exc:
            raise StateError(f"state key {MIXTURE_KEY!r}: a mixture is malformed ({exc!r})") from exc
        for name, value in (("from", start), ("epoch_size", size)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
                raise StateError(f"state key {MIXTURE_KEY!r}: a mixture's {name!r} must be a non-negative int")
        if start is None or not rows:
            raise StateError(f"state key {MIXTURE_KEY!r}: a mixture needs 'from' and at least one stream")
        for _, kind, value in rows:
            if kind not in (None, *WEIGHTS) or (kind is None) != (value is None):
                raise StateError(f"state key {MIXTURE_KEY!r}: unknown stream weight {kind!r}={value!r}")
        return cls(tuple(k for k, _, _ in rows), tuple((kind, value) for _, kind, value in rows), size, start)


@dataclass(frozen=True)
class MixtureHistory:
    """An epoch's mixtures in order (the last in force) and every stream they hold."""

    streams: Mapping[str, StreamEntry]
    mixtures: tuple[MixtureEntry, ...]

    @property
    def changed(self) -> bool:
        return len(self.mixtures) > 1

    def to_dict(self) -> dict[str, Any]:
        used = list(dict.fromkeys(k for m in self.mixtures for k in m.keys))
        index = {k: i for i, k in enumerate(used)}
        return {"streams": [{"key": k, **self.streams[k].to_dict()} for k in used],
                "history": [m.to_dict(index) for m in self.mixtures]}

    @classmethod
    def from_dict(cls, obj: Any) -> MixtureHistory:
        if not isinstance(obj, Mapping) or not isinstance(obj.get("streams"), list) \
                or not isinstance(obj.get("history"), list) or not obj["history"]:
            raise StateError(f"state key {MIXTURE_KEY!r} must hold a list of 'streams' and a non-empty 'history'")
        entries = [StreamEntry.from_dict(str(s.get("key")) if isinstance(s, Mapping) else "?", s)
                   for s in obj["streams"]]
        streams = {s.key: s for s in entries}
        mixtures = tuple(MixtureEntry.from_dict(m, [s.key for s in entries]) for m in obj["history"])
        return cls(streams, mixtures)

    def at_start(self) -> MixtureHistory:
        """The history of an epoch that has delivered nothing: its last mixture alone."""
        last = self.mixtures[-1]
        return MixtureHistory(self.streams, (MixtureEntry(last.keys, last.weights, last.epoch_size, 0),))

    def plan_history(self) -> tuple[Mixture, ...]:
        """The history as the planner takes it."""
        def spec(key: str, kind: str | None, value: float | int | None) -> StreamSpec:
            sizes = np.array(self.streams[key].shard_sizes, np.int64)
            weight: dict[str, Any] = {} if kind is None else {kind: value}
            return StreamSpec(sizes, **weight)

        return tuple(Mixture(m.keys, tuple(spec(k, *w) for k, w in zip(m.keys, m.weights, strict=True)),
                             m.epoch_size, m.start) for m in self.mixtures)

    def token(self) -> str:
        """A digest of the history (plans computed under it are cached by it)."""
        return xxhash.xxh64(json.dumps(self.to_dict(), sort_keys=True).encode()).hexdigest()


def align(saved: MixtureHistory, current: MixtureHistory) -> MixtureHistory:
    """``current`` (the dataset's one mixture) with its streams known by the state's keys.

    A key is a digest of the stream's shards (names, sample counts, bytes) and of where it
    lives, since two streams' shards may look alike. A stream found at another place with
    the same shards, where exactly one stream of the state has them, is that stream (a
    dataset copied elsewhere); one at a place the state knows, with other shards, changed.

    Raises:
        StateError: a stream changed since the state was saved (what it already delivered
            is unknown), or one that moved could be either of several streams of the state.
    """
    now = current.mixtures[-1]
    known = set(now.keys) & set(saved.streams)
    rename: dict[str, str] = {}
    for key in now.keys:
        stream = current.streams[key]
        if key in known:
            continue
        for old in saved.streams.values():
            if old.place == stream.place and old.key not in known:
                raise StateError(
                    f"stream {stream.name or key} changed since this state was saved: its shards or sample "
                    f"counts differ ({len(old.shard_sizes)} shards of {int(np.sum(old.shard_sizes))} samples then, "
                    f"{len(stream.shard_sizes)} of {int(np.sum(stream.shard_sizes))} now), so what it already delivered "
                    "this epoch is unknown; restore its shards, or start a fresh epoch instead of resuming"
                )
        alike = [old.key for old in saved.streams.values()
                 if old.content == stream.content and old.key not in known and old.key not in rename.values()]
        if len(alike) > 1:
            raise StateError(
                f"stream {stream.name or key} holds the same shards as {len(alike)} streams of this state and is "
                "not where any of them was; give it the place it had when the state was saved"
            )
        if alike:
            rename[key] = alike[0]
    if not rename:
        return current
    streams = {rename.get(k, k): replace(s, key=rename.get(k, k)) for k, s in current.streams.items()}
    return MixtureHistory(streams, (replace(now, keys=tuple(rename.get(k, k) for k in now.keys)),))


def continue_history(saved: MixtureHistory, current: MixtureHistory, position: int) -> MixtureHistory:
    """The history of a state saved under ``saved`` resumed at ``position`` by a dataset whose
    mixture is ``current`` (one mixture, :func:`align`-ed): ``current`` takes over at ``position``."""
    now = current.mixtures[-1]
    kept = tuple(m for m in saved.mixtures if m.start < position) if position else ()
    if kept and kept[-1].same_mixture(now):  # (the same mixture again: nothing changes there)
        mixtures = kept
    else:
        mixtures = (*kept, MixtureEntry(now.keys, now.weights, now.epoch_size, position))
    return MixtureHistory({**saved.streams, **current.streams}, mixtures)


def mixture_report(history: MixtureHistory, plan: EpochPlan, epoch: int) -> dict[str, Any]:
    """What ``stats()`` and ``astream plan`` say of a changed epoch: its changes, and per
    stream of the mixture in force what the rest of the epoch takes of it.

    ``plan`` is the plan of the last segment (from its start).
    """
    if not isinstance(plan, RemainderPlan):
        return {}
    seg, last = plan.segment, history.mixtures[-1]
    rows = [{"stream": history.streams[k].name or k, "weight": {kind: value} if kind else None,
             "unseen": int(u), "wanted": int(w), "given": int(c)}
            for k, (kind, value), u, w, c in zip(last.keys, last.weights, seg.unseen, seg.wanted, seg.counts,
                                                 strict=True)]
    return {"epoch": epoch, "changes": [m.start for m in history.mixtures[1:]], "samples": seg.size,
            "streams": rows}


def plan_changed(history: Sequence[Mixture], token: str, options: PlanOptions,
                 cache: MutableMapping[Hashable, Seen]) -> EpochPlan:
    """``mixed_plan`` of a changed epoch, its earlier segments replayed once per history.

    Replaying them costs their shuffles (O(epoch)), and one resume asks for plans of several
    shapes (the check at ``load_state_dict``, the warm start's first batches, each reader,
    each loader worker): ``cache`` (the run state's, which travels to the workers) keeps
    what they delivered, keyed by the history and the options but the worker count.
    """
    key = (token, options.at(sample_in_epoch=0, workers_per_rank=1))
    seen = cache.get(key)
    if seen is None:
        seen = cache[key] = seen_before(history, options)
    return mixed_plan(history, options, seen)


def pack_seen(cache: Mapping[Hashable, Seen]) -> dict[Hashable, dict[str, tuple[Any, int]]]:
    """``cache`` with its masks as bits (what a pickled run state carries: N/8 bytes a stream)."""
    return {k: {key: (np.packbits(mask), len(mask)) for key, mask in seen.items()} for k, seen in cache.items()}


def unpack_seen(packed: Mapping[Hashable, Mapping[str, tuple[Any, int]]]) -> dict[Hashable, Seen]:
    return {k: {key: np.unpackbits(bits, count=n).astype(bool) for key, (bits, n) in seen.items()}
            for k, seen in packed.items()}
