"""The mixture history in a resumable state, and what a resume under another mixture does.

A state records, besides MosaicML's five keys, the mixtures of its epoch under
``astream_mixtures``: each stream once (a digest of its shards as its key, a digest of
where it lives, its shard sizes run-length encoded: a removed stream's plan must still be
recomputed), and per mixture its weights, ``epoch_size`` and the sample it took over at.
No per-sample list: what each mixture delivered is recomputed from the plans
(:mod:`astream._sampling.remix`). The record of an epoch whose mixture never changed is
one mixture starting at 0; MosaicML's keys are untouched.

:func:`continue_history` is the one decision a ``load_state_dict`` makes about a changed
mixture (``on_mixture_change``): refuse it, or append the dataset's mixture at the state's
position. The plan follows from the history alone, so every rank and worker agrees.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import xxhash

from astream._sampling.plan import EpochPlan
from astream._sampling.remix import Mixture, RemainderPlan
from astream._sampling.streams import StreamSpec
from astream.errors import StateError

__all__ = [
    "MIXTURE_KEY",
    "MixtureEntry",
    "MixtureHistory",
    "StreamEntry",
    "continue_history",
    "mixture_report",
    "stream_key",
]

MIXTURE_KEY = "astream_mixtures"
WEIGHTS = ("proportion", "repeat", "choose")


def stream_key(shard_identities: Sequence[Sequence[Any]]) -> str:
    """A stream's key across mixtures: a digest of its shards (names, sample counts, bytes)."""
    return xxhash.xxh64(json.dumps([list(s) for s in shard_identities]).encode()).hexdigest()


def place_digest(where: str, split: str | None) -> str:
    """A digest of where a stream lives (never the URL itself: it may carry a token)."""
    return xxhash.xxh64(f"{where.rstrip('/')}|{split or ''}".encode()).hexdigest()[:8]


@dataclass(frozen=True)
class StreamEntry:
    """One stream as a state records it (once, however many mixtures hold it)."""

    key: str
    place: str
    shard_sizes: tuple[int, ...]
    name: str = ""  # how messages name it: only known for the dataset's own streams

    def to_dict(self) -> dict[str, Any]:
        runs: list[list[int]] = []
        for size in self.shard_sizes:
            if runs and runs[-1][0] == size:
                runs[-1][1] += 1
            else:
                runs.append([size, 1])
        return {"place": self.place, "shards": runs}

    @classmethod
    def from_dict(cls, key: str, obj: Any) -> StreamEntry:
        try:
            sizes = tuple(int(size) for size, count in obj["shards"] for _ in range(int(count)))
            place = str(obj["place"])
        except (KeyError, TypeError, ValueError) as exc:
            raise StateError(f"state key {MIXTURE_KEY!r}: stream {key} is malformed ({exc!r})") from exc
        if any(s < 0 for s in sizes) or not sum(sizes):
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


def continue_history(saved: MixtureHistory, current: MixtureHistory, position: int) -> MixtureHistory:
    """The history of a state saved under ``saved`` resumed at ``position`` by a dataset whose
    mixture is ``current`` (a one-mixture history): ``current`` takes over at ``position``.

    Raises:
        StateError: a stream of the dataset lives where a stream of the state lived but its
            shards or sample counts changed (it cannot continue: what it delivered is unknown).
    """
    now = current.mixtures[-1]
    for key in now.keys:
        stream = current.streams[key]
        if key in saved.streams:
            continue
        for old in saved.streams.values():
            if old.place == stream.place and old.key not in now.keys:
                raise StateError(
                    f"stream {stream.name or key} changed since this state was saved: its shards or sample "
                    f"counts differ ({len(old.shard_sizes)} shards of {sum(old.shard_sizes)} samples then, "
                    f"{len(stream.shard_sizes)} of {sum(stream.shard_sizes)} now), so what it already delivered "
                    "this epoch is unknown; restore its shards, or start a fresh epoch instead of resuming"
                )
    kept = tuple(m for m in saved.mixtures if m.start < position) if position else ()
    if kept and kept[-1].same_mixture(now):  # (the same mixture again: nothing changes there)
        mixtures = kept
    else:
        mixtures = (*kept, MixtureEntry(now.keys, now.weights, now.epoch_size, position))
    streams = {**saved.streams, **current.streams}
    return MixtureHistory(streams, mixtures)


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
