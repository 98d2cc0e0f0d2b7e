"""The resumable epoch state: a small dict, compatible with MosaicML Streaming's.

MosaicML's ``StreamingDataLoader.state_dict()`` saves five integer keys; astream saves
the same five with the same meaning, plus a fingerprint of the dataset so that a state
is never resumed against data that changed. A state without the fingerprint (saved by
MosaicML Streaming) is accepted.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import xxhash

from astream._coord.wire import MAX_EPOCH
from astream._format.columns import IndexColumns
from astream.errors import StateError

__all__ = ["FINGERPRINT_KEY", "STATE_KEYS", "EpochState", "dataset_fingerprint", "fingerprint_of"]

STATE_KEYS = ("epoch", "sample_in_epoch", "num_canonical_nodes", "shuffle_seed", "initial_physical_nodes")
FINGERPRINT_KEY = "astream_fingerprint"


def dataset_fingerprint(streams: Sequence[Mapping[str, Any]]) -> str:
    """A short digest of what decides the sample order and content of a dataset.

    Args:
        streams: per stream, a mapping with ``shards`` (a list of ``(basename, samples,
            raw_bytes)``) and the stream's weights (``proportion``, ``repeat``, ``choose``).
            Where the data lives (URL, local directory) is left out on purpose: a dataset
            copied to another bucket resumes fine.

    Returns:
        16 hex digits.
    """
    canonical = [
        {
            "shards": [list(s) for s in stream["shards"]],
            "proportion": stream.get("proportion"),
            "repeat": stream.get("repeat"),
            "choose": stream.get("choose"),
        }
        for stream in streams
    ]
    return xxhash.xxh64(json.dumps(canonical, sort_keys=True).encode()).hexdigest()


def fingerprint_of(streams: Sequence[tuple[IndexColumns, Mapping[str, Any]]]) -> str:
    """:func:`dataset_fingerprint` of streams given by their index's columns and weights: the
    same digest, its text hashed as it streams (each index's shard identities as its builder
    wrote them), so no shard's tuple is made."""
    digest = xxhash.xxh64(b"[")
    for n, (columns, weights) in enumerate(streams):
        head = json.dumps({"choose": weights.get("choose"), "proportion": weights.get("proportion"),
                           "repeat": weights.get("repeat"), "shards": []}, sort_keys=True)
        digest.update(((", " if n else "") + head[: -len("[]}")]).encode())  # ("shards" sorts last)
        for chunk in columns.identity():
            digest.update(chunk)
        digest.update(b"}")
    digest.update(b"]")
    return digest.hexdigest()


@dataclass(frozen=True)
class EpochState:
    """Where an epoch stands: what ``state_dict()`` returns and ``load_state_dict()`` takes."""

    epoch: int
    sample_in_epoch: int
    num_canonical_nodes: int
    shuffle_seed: int
    initial_physical_nodes: int | None
    fingerprint: str | None = None

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "epoch": self.epoch,
            "sample_in_epoch": self.sample_in_epoch,
            "num_canonical_nodes": self.num_canonical_nodes,
            "shuffle_seed": self.shuffle_seed,
            "initial_physical_nodes": self.initial_physical_nodes,
        }
        if self.fingerprint is not None:
            out[FINGERPRINT_KEY] = self.fingerprint
        return out

    @classmethod
    def from_dict(cls, obj: Any) -> EpochState:
        """Validate a state dict (astream's or MosaicML Streaming's).

        Raises:
            StateError: not a mapping, a key is missing, or a value has the wrong type.
        """
        if not isinstance(obj, Mapping):
            raise StateError(f"a state dict must be a mapping, got {type(obj).__name__}")
        missing = [k for k in STATE_KEYS if k not in obj]
        # MosaicML states from before initial_physical_nodes existed lack that key only.
        if missing and missing != ["initial_physical_nodes"]:
            raise StateError(
                f"state dict lacks {', '.join(missing)}; pass what loader.state_dict() returned"
            )
        values: dict[str, int | None] = {}
        for key in STATE_KEYS:
            value = obj.get(key)
            if key == "initial_physical_nodes" and value is None:
                values[key] = None
                continue
            if isinstance(value, bool) or not isinstance(value, int) or value < 0:
                raise StateError(f"state dict key {key!r} must be a non-negative int, got {value!r}")
            values[key] = value
        if (values["epoch"] or 0) > MAX_EPOCH:  # the node counts epochs within that (its wire refuses more)
            raise StateError(f"state dict key 'epoch' must be at most {MAX_EPOCH}, got {values['epoch']}")
        if values["num_canonical_nodes"] == 0:
            raise StateError("state dict key 'num_canonical_nodes' must be at least 1, got 0")
        fingerprint = obj.get(FINGERPRINT_KEY)
        if fingerprint is not None and not isinstance(fingerprint, str):
            raise StateError(f"state dict key {FINGERPRINT_KEY!r} must be a string, got {fingerprint!r}")
        epoch, sample, ncn, seed = (int(values[k] or 0) for k in STATE_KEYS[:4])
        return cls(epoch, sample, ncn, seed, values["initial_physical_nodes"], fingerprint)

    def check_fingerprint(self, expected: str) -> None:
        """Refuse a state saved against other data.

        Raises:
            StateError: the state has a fingerprint and it differs from ``expected``.
        """
        if self.fingerprint is not None and self.fingerprint != expected:
            raise StateError(
                f"this state was saved for another dataset (fingerprint {self.fingerprint}, "
                f"this dataset is {expected}): its shards, sample counts or stream weights changed; "
                "start a fresh epoch instead of resuming"
            )
