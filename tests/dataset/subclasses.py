"""Dataset subclasses and transforms the transform tests hand to worker processes.

They live in an importable module (not the test module) because worker processes
unpickle them by name, as they would a user's module.
"""

from __future__ import annotations

from typing import Any

import numpy as np

from astream import StreamingDataset


def add_label(sample: dict[str, Any]) -> dict[str, Any]:
    """A transform: a new field from the stored ones."""
    return {**sample, "label": int(sample["id"]) * 10}


def fail_on_seven(sample: dict[str, Any]) -> dict[str, Any]:
    if int(sample["id"]) == 7:
        raise ValueError("cannot tokenize sample seven")
    return sample


def double_x(batch: dict[str, Any]) -> dict[str, Any]:
    """A batch transform."""
    return {**batch, "x": np.asarray(batch["x"]) * 2}


class Decoded(StreamingDataset):
    """MosaicML's idiom: override __getitem__, call the parent, transform the sample."""

    def __getitem__(self, index: int) -> Any:
        sample = super().__getitem__(index)
        return {"id": int(sample["id"]), "text": sample["s"].upper(), "pid_of_reader": 0}


class RawHook(StreamingDataset):
    """The other hook: get_item, the raw read under __getitem__."""

    def get_item(self, index: int) -> dict[str, Any]:
        sample = super().get_item(index)
        return {**sample, "hooked": True}


class Pairs(StreamingDataset):
    """Reads a neighbour too (the next sample id), which the reader may not hold."""

    def __getitem__(self, index: int) -> Any:
        mine = super().__getitem__(index)
        other = super().__getitem__((index + 1) % self.size)
        return {"id": int(mine["id"]), "next": int(other["id"])}
