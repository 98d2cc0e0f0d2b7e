"""Keras 3: a ``PyDataset`` over a Loader, and callbacks that keep epochs and resume ``fit`` mid-epoch.

::

    import os; os.environ["KERAS_BACKEND"] = "jax"     # before keras is imported
    from astream.adapters.keras import StreamingPyDataset, StreamingCheckpoint

    train = StreamingPyDataset(loader, x="image", y="label")
    ckpt = StreamingCheckpoint(train, "ckpt/", save_freq=100)
    initial_epoch = ckpt.restore()                     # 0 on a fresh start
    if ckpt.latest() is not None:
        model = keras.saving.load_model(ckpt.model_path)
    model.fit(train, epochs=10, initial_epoch=initial_epoch, shuffle=False, callbacks=[ckpt])

``shuffle=False``: astream shuffles the samples itself (deterministically, resumably);
Keras' default batch shuffling is refused. Without checkpoints, pass
``StreamingEpochs(train)`` as the callback: it moves epochs in step with ``fit``.

Importing this module does not import keras (so the backend may still be chosen);
the classes are imported on first access. Without keras installed the import raises
:class:`~astream.errors.MissingExtraError`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from astream.adapters._extras import require

if TYPE_CHECKING:  # for type checkers only: importing the classes imports keras
    from astream.adapters._keras_callbacks import StreamingCheckpoint, StreamingEpochs
    from astream.adapters._keras_dataset import StreamingPyDataset

require("keras", "astream.adapters.keras", "keras")

__all__ = ["StreamingCheckpoint", "StreamingEpochs", "StreamingPyDataset"]


def __getattr__(name: str) -> Any:
    if name == "StreamingPyDataset":
        from astream.adapters import _keras_dataset

        return _keras_dataset.StreamingPyDataset
    if name in __all__:
        from astream.adapters import _keras_callbacks

        return getattr(_keras_callbacks, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
