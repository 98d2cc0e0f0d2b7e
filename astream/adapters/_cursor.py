"""Random access to this rank's batches of an epoch, and the state after some of them.

Keras asks for batch ``i`` of an epoch, from worker threads and in any order, so the
adapter cannot simply iterate a :class:`~astream.Loader`. It asks the loader which
global sample ids each batch holds (``Loader.batch_ids``: the same batches, in the
same order, as iterating it) and reads them with ``StreamingDataset.get_batch``. The
position is an (epoch, sample_in_epoch) pair, the same two numbers a state dict holds,
so a resumed epoch is just a plan that starts further in.

Random access costs a round of shard pins per batch. When batches are asked for in
order from the start of the epoch (Keras with one reader), the cursor streams them
from a loader iteration started at its position instead: the same batches (that is
``batch_ids``' contract), read ahead and at the loader's speed. Any other request is
served by random access.
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from typing import Any

import numpy as np

from astream import Loader
from astream.errors import ConfigError

__all__ = ["EpochCursor"]


class EpochCursor:
    """This rank's batches of one epoch, by index; moves from epoch to epoch.

    Args:
        loader: the loader whose batches (size, workers, drop_last) are served.

    Thread-safe: Keras workers read batches while the training thread may move on.
    """

    def __init__(self, loader: Loader, *, stream: bool = False) -> None:
        if not isinstance(loader, Loader):
            raise ConfigError(f"expected an astream.Loader, got {type(loader).__name__}")
        self.loader = loader
        self.dataset = loader.dataset
        self._lock = threading.Lock()
        self._stream_enabled = stream
        self._stream: Iterator[dict[str, Any]] | None = None
        self._stream_next = 0
        self._stream_lock = threading.Lock()
        # Start where the loader's next iteration would: a loaded state at its position,
        # otherwise at the start of the dataset's current epoch (0 in a fresh run).
        state = self.dataset.state_dict(0, from_beginning=False)
        self._epoch = 0
        self._offset = 0
        self._batches: list[np.ndarray] = []
        self._seek(int(state["epoch"]), int(state["sample_in_epoch"]))

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        del state["_lock"], state["_stream_lock"]
        state["_stream"] = None  # a running iteration stays in its process
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._lock = threading.Lock()
        self._stream_lock = threading.Lock()

    # -- position ------------------------------------------------------------------------------

    @property
    def epoch(self) -> int:
        """The epoch served now."""
        return self._epoch

    @property
    def offset(self) -> int:
        """Samples (all ranks) of the epoch before its first batch served here (0 unless resumed)."""
        return self._offset

    def __len__(self) -> int:
        """Batches of this rank left in the epoch from ``offset``."""
        return len(self._batches)

    def _seek(self, epoch: int, offset: int) -> None:
        batches = self.loader.batch_ids(epoch, offset)
        if not batches and offset > 0:
            # A state saved after the last batch of an epoch: the next epoch, from its start.
            epoch, offset, batches = epoch + 1, 0, self.loader.batch_ids(epoch + 1, 0)
        self.close_stream()
        with self._lock:
            self._epoch, self._offset, self._batches = epoch, offset, batches

    def advance(self) -> None:
        """Move to the start of the next epoch."""
        self._seek(self._epoch + 1, 0)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Move to the position a state dict names (and adopt its run values).

        Raises:
            StateError: the state does not fit the dataset or world.
        """
        self.loader.load_state_dict(state)
        self._seek(int(state["epoch"]), int(state["sample_in_epoch"]))

    # -- batches -------------------------------------------------------------------------------

    def ids(self, index: int) -> np.ndarray:
        """Global sample ids of batch ``index`` of the epoch.

        Raises:
            IndexError: ``index`` is outside ``[0, len(self))``.
        """
        batches = self._batches  # one read: a concurrent seek swaps the whole list
        if not 0 <= index < len(batches):
            raise IndexError(f"batch {index} is out of range: this epoch has {len(batches)} batches on this rank")
        return batches[index]

    def fetch(self, index: int) -> dict[str, Any]:
        """Batch ``index`` of the epoch (dict of arrays, lists for str/bytes/ragged columns)."""
        ids = self.ids(index)
        if self._stream_enabled:
            with self._stream_lock:
                if index == 0:
                    self._open_stream()
                if self._stream is not None and index == self._stream_next:
                    self._stream_next += 1
                    batch = next(self._stream, None)
                    if batch is not None and _length(batch) == len(ids):
                        return batch
                    self.close_stream()  # cannot happen by batch_ids' contract; stay correct anyway
        return self.dataset.get_batch(ids)

    def _open_stream(self) -> None:
        # Keras starts over at batch 0 to build a model, for a tf.data signature and at
        # every epoch: each time, a fresh loader iteration from this cursor's position.
        self.close_stream()
        self.loader.load_state_dict(self.state_dict(0))
        self._stream = iter(self.loader)
        self._stream_next = 0

    def close_stream(self) -> None:
        """Stop the loader iteration that serves in-order requests, if one runs."""
        stream, self._stream = self._stream, None
        close = getattr(stream, "close", None)
        if close is not None:
            close()

    # -- state ---------------------------------------------------------------------------------

    def state_dict(self, batches_done: int = 0) -> dict[str, Any]:
        """The state after the first ``batches_done`` batches of the epoch were trained on.

        ``sample_in_epoch`` counts samples of all ranks, as ``Loader.state_dict`` does:
        this rank's samples times the ranks, divided by ``replication``.
        """
        with self._lock:
            epoch, offset, batches = self._epoch, self._offset, self._batches
        if not 0 <= batches_done <= len(batches):
            raise ConfigError(f"batches_done={batches_done} is outside [0, {len(batches)}]")
        mine = sum(len(b) for b in batches[:batches_done])
        ds = self.dataset
        consumed = mine * ds.unique_world.world_size
        if ds.replication:
            consumed //= ds.replication
        if batches_done == len(batches):
            # The whole epoch is done: save the start of the next one, which needs no
            # knowledge of how the last batches were spread over the ranks.
            epoch, sample = epoch + 1, 0
        else:
            sample = offset + consumed
        # The dataset's state carries the run values (canonical nodes, seed, first world,
        # fingerprint); the position is ours.
        state = ds.state_dict(sample, from_beginning=True)
        state["epoch"] = epoch
        state["sample_in_epoch"] = sample
        return state


def _length(batch: dict[str, Any]) -> int:
    first = next(iter(batch.values()), ())
    return len(first)
