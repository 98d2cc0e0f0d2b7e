"""Keras 3: a ``PyDataset`` over a Loader, and a callback that resumes ``fit`` mid-epoch.

::

    import os; os.environ["KERAS_BACKEND"] = "jax"     # before keras is imported
    from astream.adapters.keras import StreamingPyDataset, StreamingCheckpoint

    train = StreamingPyDataset(loader, x="image", y="label")
    ckpt = StreamingCheckpoint(train, "ckpt/", save_freq=100)
    model.fit(train, epochs=10, initial_epoch=ckpt.restore(), callbacks=[ckpt])

Importing this module does not import keras (so the backend may still be chosen);
the classes are built on first access. Without keras installed the import raises
:class:`~astream.errors.MissingExtraError`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from astream.adapters._extras import require

if TYPE_CHECKING:  # for type checkers only: importing the classes imports keras
    from astream.adapters._keras_impl import StreamingCheckpoint, StreamingPyDataset

require("keras", "astream.adapters.keras", "keras")

__all__ = ["StreamingCheckpoint", "StreamingPyDataset"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from astream.adapters import _keras_impl

        return getattr(_keras_impl, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
