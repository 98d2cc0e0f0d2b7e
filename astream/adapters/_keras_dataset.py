"""``StreamingPyDataset``; imported by :mod:`astream.adapters.keras` on first use (imports keras)."""

from __future__ import annotations

import multiprocessing
import threading
from collections.abc import Callable
from typing import Any

import keras

from astream import Loader
from astream.adapters._columns import Columns, select_columns
from astream.adapters._cursor import EpochCursor
from astream.errors import ConfigError, UsageError

__all__ = ["StreamingPyDataset"]

_SHUFFLED = (
    "model.fit asked for batch {index} of an epoch before batch {expected}: Keras is shuffling the "
    "batches (fit's default, shuffle=True). Pass shuffle=False to fit: astream already shuffles the "
    "samples, deterministically and resumably, which Keras' batch shuffling is not"
)


class StreamingPyDataset(keras.utils.PyDataset):  # type: ignore[misc,unused-ignore]
    """A ``keras.utils.PyDataset`` over a :class:`~astream.Loader`: batch ``i`` by random access.

    ``len()`` is this rank's batches per epoch; ``ds[i]`` reads batch ``i`` of this rank's
    epoch plan (the loader's batches, in its order), so Keras' worker threads, and any
    order they ask in, give the same batches. Give ``fit`` a :class:`StreamingEpochs`
    (or :class:`StreamingCheckpoint`) callback and pass ``shuffle=False``: the callback
    moves to the next epoch when Keras ends one. Without it the dataset moves on at
    ``on_epoch_end`` once every batch was read, which Keras' read-ahead threads
    (``workers > 1``) can fake while it builds a new model on its first batch.

    Args:
        loader: the loader; its batch size, ``drop_last`` and ``num_workers`` decide the
            batches (iterating this dataset and the loader give the same ones).
        x: input column name, or names (a dict by name, matched to the model's inputs).
        y: target column name(s).
        sample_weight: sample-weight column name(s).
        map_fn: instead of names, a function from the batch dict to what ``fit`` takes.
        workers: Keras' reader threads (more help with remote data: each batch whose
            shards are not cached yet waits for a download).
        use_multiprocessing: read in processes; needs the ``spawn`` or ``forkserver``
            start method (astream never forks a process that runs its event loop).
        max_queue_size: batches Keras keeps ready.

    Raises:
        ConfigError: unknown column names, both ``map_fn`` and names, or
            ``use_multiprocessing`` with the ``fork`` start method.
    """

    def __init__(
        self,
        loader: Loader,
        *,
        x: Columns = None,
        y: Columns = None,
        sample_weight: Columns = None,
        map_fn: Callable[[dict[str, Any]], Any] | None = None,
        workers: int = 1,
        use_multiprocessing: bool = False,
        max_queue_size: int = 10,
    ) -> None:
        if use_multiprocessing and multiprocessing.get_start_method() == "fork":
            raise ConfigError(
                "use_multiprocessing=True forks Keras' reader processes, which is unsafe once astream's "
                "event loop runs; call multiprocessing.set_start_method('spawn') (or 'forkserver') first, "
                "or read with threads (workers=N, use_multiprocessing=False)"
            )
        super().__init__(workers=workers, use_multiprocessing=use_multiprocessing, max_queue_size=max_queue_size)
        # One reader asks in order: stream. Threads ask in their own order: random access.
        self._cursor = EpochCursor(loader, stream=workers <= 1 and not use_multiprocessing)
        self._convert = select_columns(loader.dataset.columns, x, y, sample_weight, map_fn)
        self._served: set[int] = set()
        self._served_lock = threading.Lock()
        # Requests since Keras last (re)started at batch 0, to notice fit(shuffle=True).
        self._requests = 0
        self._lookahead = 0 if workers <= 1 and not use_multiprocessing else workers + max_queue_size
        self._driven = False  # True once a StreamingEpochs callback moves the epochs

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        del state["_served_lock"]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._served_lock = threading.Lock()

    # -- the PyDataset protocol ----------------------------------------------------------------

    def __len__(self) -> int:
        """Batches of this rank in the current epoch (fewer in an epoch resumed mid-way)."""
        return len(self._cursor)

    def __getitem__(self, index: int) -> Any:
        """Batch ``index`` of this rank's current epoch, converted for ``fit``.

        Raises:
            IndexError: ``index`` is outside the epoch.
        """
        index = int(index)
        epoch = self._cursor.epoch
        with self._served_lock:
            self._check_order(index)
        batch = self._cursor.fetch(index)
        with self._served_lock:
            if epoch == self._cursor.epoch:
                self._served.add(index)
        return self._convert(batch)

    def _check_order(self, index: int) -> None:
        # Keras reads batch 0 again whenever it starts an iterator (to build the model, for
        # a tf.data signature, at each epoch); without shuffling it then asks in order, up
        # to workers + queue batches ahead when it reads with threads.
        if index == 0:
            self._requests = 0
        elif index > self._requests + self._lookahead:
            raise UsageError(_SHUFFLED.format(index=index, expected=self._requests))
        self._requests += 1

    def on_epoch_end(self) -> None:
        """Move to the next epoch once all of this one was read.

        Keras also calls this outside a training epoch (after building the model on
        one batch, or when an iterator stops early); an epoch that was not read through
        therefore does not count. A :class:`StreamingEpochs` callback moves epochs itself.
        """
        if self._driven:
            return
        with self._served_lock:
            complete = len(self._served) >= len(self._cursor)
        if complete:
            self.advance_epoch()

    # -- position and state --------------------------------------------------------------------

    @property
    def epoch(self) -> int:
        """The astream epoch served now."""
        return self._cursor.epoch

    @property
    def loader(self) -> Loader:
        return self._cursor.loader

    def batch_ids(self, index: int) -> Any:
        """The global sample ids of batch ``index`` of the current epoch (a NumPy array)."""
        return self._cursor.ids(index)

    def advance_epoch(self) -> None:
        """Serve the next epoch from its start."""
        with self._served_lock:
            self._served.clear()
        self._cursor.advance()

    def state_dict(self, batches_done: int = 0) -> dict[str, Any]:
        """The resumable state after ``batches_done`` batches of the current epoch were trained on."""
        return self._cursor.state_dict(batches_done)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Serve from the position of ``state`` (its epoch, the batches it had not reached).

        Raises:
            StateError: the state does not fit this dataset or world.
        """
        with self._served_lock:
            self._served.clear()
        self._cursor.load_state_dict(state)
