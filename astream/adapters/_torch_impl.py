"""The torch class; imported by :mod:`astream.adapters.torch` on first use (imports torch)."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info

from astream import Loader
from astream.errors import ConfigError, UsageError

__all__ = ["StreamingIterableDataset", "to_tensors"]


def _tensor(value: Any) -> Any:
    if isinstance(value, np.ndarray) and value.dtype.kind in "biufc":
        # Batches may be read-only views of a shard; torch wants writable memory.
        return torch.from_numpy(value if value.flags.writeable else value.copy())
    return value  # str/bytes lists and other objects stay as they are


def to_tensors(batch: Any) -> Any:
    """A batch dict with its numeric NumPy columns as CPU tensors (zero-copy when writable)."""
    if isinstance(batch, dict):
        return {name: _tensor(value) for name, value in batch.items()}
    return _tensor(batch)


class StreamingIterableDataset(IterableDataset[Any]):  # type: ignore[misc,unused-ignore]
    """A ``torch.utils.data.IterableDataset`` of a Loader's batches (one epoch per pass).

    For code moving from MosaicML Streaming step by step: keep the torch training loop,
    read through astream. Batching, shuffling and workers are astream's, so wrap it in
    ``DataLoader(ds, batch_size=None, num_workers=0)``.

    Args:
        loader: the astream loader.
        tensors: convert numeric columns to tensors (False: NumPy arrays as they come).

    Raises:
        UsageError: iterated inside a torch ``DataLoader`` worker (every worker would read
            the whole epoch; use ``Loader(num_workers=N)`` instead).
    """

    def __init__(self, loader: Loader, *, tensors: bool = True) -> None:
        super().__init__()
        if not isinstance(loader, Loader):
            raise ConfigError(f"StreamingIterableDataset needs an astream.Loader, got {type(loader).__name__}")
        self.loader = loader
        self.tensors = tensors

    def __iter__(self) -> Iterator[Any]:
        if get_worker_info() is not None:
            raise UsageError(
                "StreamingIterableDataset runs in a torch DataLoader worker, where each worker would read the "
                "whole epoch (and workers fork astream's event loop): use DataLoader(ds, batch_size=None, "
                "num_workers=0) and astream.Loader(num_workers=N) for parallel reading"
            )
        for batch in self.loader:
            yield to_tensors(batch) if self.tensors else batch

    def __len__(self) -> int:
        """Batches per epoch on this rank."""
        return len(self.loader)

    def state_dict(self) -> dict[str, Any]:
        """The loader's resumable state (MosaicML-compatible keys)."""
        return self.loader.state_dict()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume mid-epoch at the next pass."""
        self.loader.load_state_dict(state)
