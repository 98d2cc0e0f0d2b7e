"""The Keras classes; imported by :mod:`astream.adapters.keras` on first use (imports keras)."""

from __future__ import annotations

import json
import multiprocessing
import os
import shutil
import threading
import warnings
from collections.abc import Callable
from pathlib import Path
from typing import Any

import keras

from astream import Loader
from astream.adapters._columns import Columns, select_columns
from astream.adapters._cursor import EpochCursor
from astream.errors import ConfigError, StateError, UsageError

__all__ = ["StreamingCheckpoint", "StreamingPyDataset"]

# Keras warns when an epoch ends before the steps it planned; a resumed epoch does that
# on purpose (it holds only the batches the interrupted run had not trained on).
_RAN_OUT = r"Your input ran out of data"
_LATEST = "latest"
_STATE_FILE = "astream_state.json"
_MODEL_FILE = "model.keras"
_SHUFFLED = (
    "model.fit asked for batch {index} of an epoch before batch {expected}: Keras is shuffling the "
    "batches (fit's default, shuffle=True). Pass shuffle=False to fit: astream already shuffles the "
    "samples, deterministically and resumably, which Keras' batch shuffling is not"
)


class StreamingPyDataset(keras.utils.PyDataset):  # type: ignore[misc]
    """A ``keras.utils.PyDataset`` over a :class:`~astream.Loader`: batch ``i`` by random access.

    ``len()`` is this rank's batches per epoch; ``ds[i]`` reads batch ``i`` of this rank's
    epoch plan (the loader's batches, in its order), so Keras' worker threads, and any
    order they ask in, give the same batches. The epoch moves on at ``on_epoch_end``
    once every batch of it was read, or, with a :class:`StreamingCheckpoint`, when that
    callback says an epoch ended (it also resumes a run mid-epoch).

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
        self._cursor = EpochCursor(loader)
        self._convert = select_columns(loader.dataset.columns, x, y, sample_weight, map_fn)
        self._served: set[int] = set()
        self._served_lock = threading.Lock()
        # Requests since Keras last (re)started at batch 0, to notice fit(shuffle=True).
        self._requests = 0
        self._lookahead = 0 if workers <= 1 and not use_multiprocessing else workers + max_queue_size
        self._driven = False  # True while a StreamingCheckpoint moves the epochs

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
        therefore does not count. A :class:`StreamingCheckpoint` moves epochs itself.
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


class StreamingCheckpoint(keras.callbacks.Callback):  # type: ignore[misc]
    """Saves the model and astream's position together; resumes ``model.fit`` mid-epoch.

    Every ``save_freq`` batches (or at each epoch end) it writes ``directory/ckpt-N/``
    with ``model.keras`` (weights and optimizer) and ``astream_state.json`` (the Keras
    epoch and the loader state), then points ``directory/latest`` at it (written to a
    temporary file and renamed, so a crash leaves the previous checkpoint in force).

    Resuming::

        ckpt = StreamingCheckpoint(train, "ckpt/", save_freq=100)
        initial_epoch = ckpt.restore()             # 0 when there is no checkpoint yet
        if initial_epoch:
            model = keras.saving.load_model(ckpt.model_path)
        model.fit(train, epochs=10, initial_epoch=initial_epoch, callbacks=[ckpt])

    The resumed ``fit`` first trains on the batches of the interrupted epoch that the
    checkpoint had not reached, then on whole epochs: the samples, in order, of a run
    that was never interrupted.

    Args:
        dataset: the :class:`StreamingPyDataset` given to ``fit``.
        directory: where checkpoints go.
        save_freq: ``"epoch"`` or a number of batches.
        keep: checkpoints kept (older ones are deleted).
        save_model: also save the model (False: only astream's state, for users who save
            the model with their own callback at the same moments).

    Raises:
        ConfigError: a bad ``save_freq`` or ``keep``.
    """

    def __init__(
        self,
        dataset: StreamingPyDataset,
        directory: str | os.PathLike[str],
        *,
        save_freq: int | str = "epoch",
        keep: int = 2,
        save_model: bool = True,
    ) -> None:
        super().__init__()
        if not isinstance(dataset, StreamingPyDataset):
            raise ConfigError(f"StreamingCheckpoint needs a StreamingPyDataset, got {type(dataset).__name__}")
        if save_freq != "epoch" and (isinstance(save_freq, bool) or not isinstance(save_freq, int) or save_freq < 1):
            raise ConfigError(f"save_freq must be 'epoch' or an int >= 1, got {save_freq!r}")
        if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
            raise ConfigError(f"keep must be an int >= 1, got {keep!r}")
        self.dataset = dataset
        self.directory = Path(directory)
        self.save_freq = save_freq
        self.keep = keep
        self.save_model = save_model
        dataset._driven = True
        self._pending: dict[str, Any] | None = None
        self._epoch = 0
        self._batches_done = 0
        self._steps = 0
        self._quiet: warnings.catch_warnings[None] | None = None

    # -- files -----------------------------------------------------------------------------------

    def latest(self) -> Path | None:
        """The newest complete checkpoint folder, or None."""
        pointer = self.directory / _LATEST
        if not pointer.is_file():
            return None
        folder = self.directory / pointer.read_text().strip()
        return folder if (folder / _STATE_FILE).is_file() else None

    @property
    def model_path(self) -> Path:
        """The model file of the newest checkpoint (for ``keras.saving.load_model``).

        Raises:
            StateError: there is no checkpoint.
        """
        folder = self.latest()
        if folder is None:
            raise StateError(f"no checkpoint in {self.directory}")
        return folder / _MODEL_FILE

    def restore(self) -> int:
        """Load astream's position from the newest checkpoint, for the next ``fit``.

        Returns:
            The ``initial_epoch`` to give ``fit`` (0 when there is no checkpoint).

        Raises:
            StateError: the checkpoint is unreadable or does not fit the dataset.
        """
        folder = self.latest()
        if folder is None:
            return 0
        try:
            saved = json.loads((folder / _STATE_FILE).read_text())
            epoch, state, steps = int(saved["keras_epoch"]), saved["astream"], int(saved.get("steps", 0))
        except (OSError, ValueError, KeyError, TypeError) as exc:
            raise StateError(f"checkpoint {folder / _STATE_FILE} is unreadable: {exc}") from exc
        # Validate now; the position is taken at on_train_begin, after Keras has read the
        # full epoch length it plans every epoch with.
        self.dataset.loader.dataset.load_state_dict(state)
        self._pending = state
        self._steps = steps  # checkpoint names keep counting where the run stopped
        return epoch

    def save(self) -> Path:
        """Write a checkpoint now (model and position after the batches trained so far)."""
        self.directory.mkdir(parents=True, exist_ok=True)
        state = self.dataset.state_dict(self._batches_done)
        done = self._batches_done == len(self.dataset)
        name = f"ckpt-{self._steps:09d}-e{self._epoch}"
        folder = self.directory / name
        tmp = self.directory / f".{name}.tmp"
        shutil.rmtree(tmp, ignore_errors=True)
        tmp.mkdir()
        if self.save_model:
            self.model.save(tmp / _MODEL_FILE)
        record = {"keras_epoch": self._epoch + 1 if done else self._epoch, "steps": self._steps, "astream": state}
        (tmp / _STATE_FILE).write_text(json.dumps(record))
        shutil.rmtree(folder, ignore_errors=True)
        os.replace(tmp, folder)
        pointer = self.directory / f".{_LATEST}.tmp"
        pointer.write_text(name)
        os.replace(pointer, self.directory / _LATEST)
        self._prune(keep_name=name)
        return folder

    def _prune(self, keep_name: str) -> None:
        folders = sorted(p for p in self.directory.glob("ckpt-*") if p.is_dir() and p.name != keep_name)
        for old in folders[: max(0, len(folders) - (self.keep - 1))]:
            shutil.rmtree(old, ignore_errors=True)

    # -- Keras hooks -----------------------------------------------------------------------------

    def on_train_begin(self, logs: dict[str, Any] | None = None) -> None:
        if self._pending is not None:
            self.dataset.load_state_dict(self._pending)
            self._pending = None

    def on_epoch_begin(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self._epoch = epoch
        self._batches_done = 0
        planned = (self.params or {}).get("steps")
        if planned and len(self.dataset) < planned:
            # The rest of an interrupted epoch: Keras will find it short, and say so.
            self._quiet = warnings.catch_warnings()
            self._quiet.__enter__()
            warnings.filterwarnings("ignore", message=_RAN_OUT)

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        self._batches_done = batch + 1
        self._steps += 1
        if self.save_freq != "epoch" and self._steps % int(self.save_freq) == 0:
            self.save()

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        if self._quiet is not None:
            self._quiet.__exit__(None, None, None)
            self._quiet = None
        if self.save_freq == "epoch":
            self.save()
        if self._batches_done >= len(self.dataset):
            self.dataset.advance_epoch()
        else:
            # Stopped early (EarlyStopping, stop_training): the next fit goes on from here.
            self.dataset.load_state_dict(self.dataset.state_dict(self._batches_done))
        self._batches_done = 0

    def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
        if self._quiet is not None:
            self._quiet.__exit__(None, None, None)
            self._quiet = None
