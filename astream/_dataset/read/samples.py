"""Samples read one by one: a subclass's ``__getitem__``/``get_item`` and ``transform=``.

The reader reads batches column-wise (vectorised) unless something must see each
sample: a ``transform``, or a subclass of ``StreamingDataset`` that overrides
``__getitem__`` or ``get_item`` (MosaicML's idiom for decoding and augmenting). Then
every sample of a batch goes through the dataset's own ``__getitem__``, as MosaicML's
iteration does, and the results are collated.

That code is the user's and synchronous, so a batch's samples run in an executor
thread, never on the event loop. When the base ``get_item`` runs there it reads the
sample straight from the reader's open shards (:func:`inline_reads`: no I/O, no
round trip to the loop); a sample the reader does not hold (a subclass reading a
neighbour) is fetched as random access would fetch it.
"""

from __future__ import annotations

import threading
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any

from astream.errors import AstreamError, TransformError

__all__ = ["SampleSteps", "apply_batch_transform", "inline_reads", "read_inline"]

Lookup = Callable[[int], "dict[str, Any] | None"]

_inline = threading.local()


@contextmanager
def inline_reads(lookup: Lookup) -> Iterator[None]:
    """Inside the block, :func:`read_inline` in this thread asks ``lookup`` first."""
    previous = getattr(_inline, "lookup", None)
    _inline.lookup = lookup
    try:
        yield
    finally:
        _inline.lookup = previous


def read_inline(index: int) -> dict[str, Any] | None:
    """Sample ``index`` from the reader this thread works for, or None (not held, or no reader)."""
    lookup: Lookup | None = getattr(_inline, "lookup", None)
    return None if lookup is None else lookup(index)


@dataclass(frozen=True)
class SampleSteps:
    """What each sample goes through: the dataset's ``__getitem__`` (with its transform).

    Args:
        getitem: the dataset's bound ``__getitem__`` (a subclass's, or the base one that
            applies ``transform``).
        describe: names a sample for an error message (its id, shard and stream).
    """

    getitem: Callable[[int], Any]
    describe: Callable[[int], str]

    def run(self, ids: Sequence[int], lookup: Lookup) -> list[Any]:
        """The processed samples ``ids``, read through ``lookup`` where it has them.

        Raises:
            TransformError: the user's code raised; names the sample and its shard.
        """
        out = []
        with inline_reads(lookup):
            for sample_id in ids:
                try:
                    out.append(self.getitem(sample_id))
                except AstreamError:
                    raise
                except Exception as exc:
                    raise TransformError(
                        f"{self.describe(sample_id)}: the dataset's transform or __getitem__ raised "
                        f"{type(exc).__name__}: {exc}"
                    ) from exc
        return out


def apply_batch_transform(fn: Callable[[Any], Any], batch: Any) -> Any:
    """``Loader(batch_transform=fn)`` on one batch; the user's error becomes a TransformError."""
    try:
        return fn(batch)
    except AstreamError:
        raise
    except Exception as exc:
        raise TransformError(f"Loader's batch_transform raised {type(exc).__name__}: {exc}") from exc
