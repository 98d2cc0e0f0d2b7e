"""torch (optional, for gradual migration): an ``IterableDataset`` over a Loader.

::

    from astream.adapters.torch import StreamingIterableDataset
    batches = torch.utils.data.DataLoader(StreamingIterableDataset(loader), batch_size=None)

torch is never a dependency of astream: this module is the only place that imports it,
and only when the class is first used. Without torch, importing this module raises
:class:`~astream.errors.MissingExtraError`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from astream.adapters._extras import require

if TYPE_CHECKING:  # for type checkers only: importing the class imports torch
    from astream.adapters._torch_impl import StreamingIterableDataset, to_tensors

require("torch", "astream.adapters.torch", "torch")

__all__ = ["StreamingIterableDataset", "to_tensors"]


def __getattr__(name: str) -> Any:
    if name in __all__:
        from astream.adapters import _torch_impl

        return getattr(_torch_impl, name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
