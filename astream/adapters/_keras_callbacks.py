"""Keras callbacks that keep astream's position in step with ``fit`` (imports keras).

:class:`StreamingEpochs` moves a :class:`StreamingPyDataset` from epoch to epoch when
Keras does, and knows how many batches of the current epoch were trained on.
:class:`StreamingCheckpoint` adds crash-safe checkpoints of the model and that position,
and resumes a ``fit`` mid-epoch.
"""

from __future__ import annotations

import json
import os
import shutil
import warnings
from pathlib import Path
from typing import Any

import keras

from astream.adapters._keras_dataset import StreamingPyDataset
from astream.errors import ConfigError, StateError

__all__ = ["StreamingCheckpoint", "StreamingEpochs"]

# Keras warns when an epoch ends before the steps it planned; a resumed epoch does that
# on purpose (it holds only the batches the interrupted run had not trained on).
_RAN_OUT = r"Your input ran out of data"
_LATEST = "latest"
_STATE_FILE = "astream_state.json"
_MODEL_FILE = "model.keras"


class StreamingEpochs(keras.callbacks.Callback):  # type: ignore[misc,unused-ignore]
    """Moves a :class:`StreamingPyDataset` to the next epoch when Keras ends one.

    Keras calls ``PyDataset.on_epoch_end`` also outside training epochs; this callback
    sees the real ones. It also counts the batches trained on, so ``state_dict()`` is
    the position of the training, not of Keras' read-ahead.

    Args:
        dataset: the :class:`StreamingPyDataset` given to ``fit``.
    """

    def __init__(self, dataset: StreamingPyDataset) -> None:
        super().__init__()
        if not isinstance(dataset, StreamingPyDataset):
            raise ConfigError(f"{type(self).__name__} needs a StreamingPyDataset, got {type(dataset).__name__}")
        self.dataset = dataset
        dataset._driven = True
        self._pending: dict[str, Any] | None = None
        self._epoch = 0
        self._batches_done = 0
        self._steps = 0
        self._quiet: warnings.catch_warnings[None] | None = None

    @property
    def steps(self) -> int:
        """Batches trained on in this run, counting those of a restored checkpoint."""
        return self._steps

    def state_dict(self) -> dict[str, Any]:
        """astream's state after the batches trained on so far (MosaicML-compatible keys)."""
        return self.dataset.state_dict(self._batches_done)

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume from ``state`` at the next ``fit`` (validated now).

        The position is taken at ``on_train_begin``: Keras reads the epoch length it
        plans every epoch with before that, and must read the full one.

        Raises:
            StateError: the state does not fit the dataset or world.
        """
        self.dataset.loader.dataset.load_state_dict(state)
        self._pending = state

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

    def on_epoch_end(self, epoch: int, logs: dict[str, Any] | None = None) -> None:
        self._unquiet()
        self._epoch_done()
        if self._batches_done >= len(self.dataset):
            self.dataset.advance_epoch()
        else:
            # Stopped early (EarlyStopping, stop_training): the next fit goes on from here.
            self.dataset.load_state_dict(self.dataset.state_dict(self._batches_done))
        self._batches_done = 0

    def on_train_end(self, logs: dict[str, Any] | None = None) -> None:
        self._unquiet()

    def _epoch_done(self) -> None:
        """Hook for subclasses: the epoch ended, the position is still the epoch's."""

    def _unquiet(self) -> None:
        if self._quiet is not None:
            self._quiet.__exit__(None, None, None)
            self._quiet = None


class StreamingCheckpoint(StreamingEpochs):
    """Saves the model and astream's position together; resumes ``model.fit`` mid-epoch.

    Every ``save_freq`` batches (or at each epoch end) it writes ``directory/ckpt-N/``
    with ``model.keras`` (weights and optimizer) and ``astream_state.json`` (the Keras
    epoch and the loader state), then points ``directory/latest`` at it (written to a
    temporary file and renamed, so a crash leaves the previous checkpoint in force).

    Resuming::

        ckpt = StreamingCheckpoint(train, "ckpt/", save_freq=100)
        initial_epoch = ckpt.restore()             # 0 when there is no checkpoint yet
        if ckpt.latest() is not None:
            model = keras.saving.load_model(ckpt.model_path)
        model.fit(train, epochs=10, initial_epoch=initial_epoch, shuffle=False, callbacks=[ckpt])

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
        super().__init__(dataset)
        if save_freq != "epoch" and (isinstance(save_freq, bool) or not isinstance(save_freq, int) or save_freq < 1):
            raise ConfigError(f"save_freq must be 'epoch' or an int >= 1, got {save_freq!r}")
        if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
            raise ConfigError(f"keep must be an int >= 1, got {keep!r}")
        self.directory = Path(directory)
        self.save_freq = save_freq
        self.keep = keep
        self.save_model = save_model

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
        self.load_state_dict(state)
        self._steps = steps  # checkpoint names keep counting where the run stopped
        return epoch

    def save(self) -> Path:
        """Write a checkpoint now: the model and the position after the batches trained so far."""
        self.directory.mkdir(parents=True, exist_ok=True)
        state = self.state_dict()
        done = self._batches_done >= len(self.dataset)
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

    def on_train_batch_end(self, batch: int, logs: dict[str, Any] | None = None) -> None:
        super().on_train_batch_end(batch, logs)
        if self.save_freq != "epoch" and self._steps % int(self.save_freq) == 0:
            self.save()

    def _epoch_done(self) -> None:
        if self.save_freq == "epoch":
            self.save()
