"""``torch.utils.data.DataLoader(ds, ...)`` over a ``StreamingDataset``, without importing torch.

Every MosaicML training script hands its dataset to torch's ``DataLoader``. torch reads a
dataset that has ``__len__`` and ``__getitem__`` as map-style (indices ``0..len-1``, in
order: no shuffle, the same samples on every rank, no ``epoch_size``) unless it is an
``IterableDataset``. So, never importing torch (only looking in ``sys.modules``):

* when torch is already imported as the dataset is made (a script imports it first),
  ``StreamingDataset`` is registered as a virtual subclass of torch's ``IterableDataset``
  (an ABC). ``DataLoader(ds, batch_size=B)`` then iterates it in the main process: this
  rank's samples in MosaicML's order, collated by torch; ``ds.state_dict()`` is right,
  since the process that counts is the one that reads;
* in a torch worker process (``num_workers > 0``) iterating is refused, with the one-line
  change to ``astream.Loader``: each worker would need its share of the rank's order and
  an epoch agreed with the others, which MosaicML gets from shared memory and astream does
  not have in torch's workers (its own workers get both from the loader), and the main
  process, which never iterates there, would checkpoint a stale epoch;
* iterated by torch without the dataset's ``batch_size`` (the order depends on it):
  refused, as MosaicML refuses it;
* torch imported after the dataset was made, or a torch sampler given: the sampler asks
  ``len(ds)`` before the first index, and that call is refused, naming the fix.

Which caller is torch is read off the calling frame's module: ``torch.utils.data._utils.fetch``
is the only caller of ``iter(dataset)`` in torch's loader, and its samplers
(``torch.utils.data.sampler`` and ``.distributed``) the only callers of ``len`` before a
map-style read.
"""

from __future__ import annotations

import sys
from types import FrameType
from typing import Any

from astream.errors import ConfigError, UsageError

__all__ = ["check_len_caller", "check_torch_iteration", "register_with_torch"]

_DATA = "torch.utils.data"
_FETCHER = "torch.utils.data._utils.fetch"
_SAMPLERS = ("torch.utils.data.sampler", "torch.utils.data.distributed")


def register_with_torch(cls: type) -> None:
    """Make ``cls`` an ``IterableDataset`` to torch, if the program imported torch."""
    data = sys.modules.get(_DATA)
    iterable = getattr(data, "IterableDataset", None)
    if iterable is not None and not issubclass(cls, iterable):
        iterable.register(cls)


def _module_of(frame: FrameType | None) -> str:
    return str(frame.f_globals.get("__name__", "")) if frame is not None else ""


def _loader_line(batch_size: int | None, workers: int | str) -> str:
    return f"astream.Loader(ds, batch_size={batch_size or 'B'}, num_workers={workers})"


def check_torch_iteration(ds: Any, caller: FrameType | None) -> None:
    """Refuse what torch's ``DataLoader`` cannot get right when it calls ``iter(ds)``.

    Raises:
        UsageError: in a torch worker process.
        ConfigError: the dataset has no ``batch_size``.
    """
    if _module_of(caller) != _FETCHER:
        return
    worker_info = getattr(sys.modules.get(_DATA), "get_worker_info", None)
    info = worker_info() if worker_info is not None else None
    size = ds.config.batch_size
    if info is not None:
        workers = int(info.num_workers)
        raise UsageError(
            f"torch.utils.data.DataLoader(ds, num_workers={workers}) runs this StreamingDataset in {workers} "
            "torch worker processes, which cannot split the rank's samples between them as MosaicML's do "
            f"(through its shared memory). Change that one line to {_loader_line(size, workers)}: MosaicML's "
            "batches in MosaicML's order, with state_dict()/load_state_dict() (DataLoader with num_workers=0 "
            "also works)"
        )
    if size is None:
        raise ConfigError(
            "torch.utils.data.DataLoader iterates this StreamingDataset, which was made without batch_size; "
            "the sample order depends on it, so MosaicML refuses this too: give StreamingDataset(..., "
            "batch_size=B) the DataLoader's batch_size, or use astream.Loader(ds, batch_size=B)"
        )


def check_len_caller(ds: Any, caller: FrameType | None) -> None:
    """Refuse ``len(ds)`` asked by a torch sampler: a map-style read of ``0..len-1`` follows.

    Raises:
        UsageError: naming why torch took the dataset as map-style and the fix.
    """
    module = _module_of(caller)
    if module not in _SAMPLERS:
        return
    data = sys.modules.get(_DATA)
    iterable = getattr(data, "IterableDataset", None)
    if iterable is not None and isinstance(ds, iterable):
        why = ("a torch sampler (sampler=, DistributedSampler) was given; StreamingDataset shuffles and splits "
               "over ranks itself, so drop the sampler")
    else:
        why = ("torch was imported after the StreamingDataset was made, so astream could not tell torch it is "
               "an IterableDataset; import torch before making the dataset")
    raise UsageError(
        f"torch.utils.data.DataLoader is about to read this StreamingDataset as a map-style dataset (indices "
        f"0..len-1 in order: no shuffle, the same samples on every rank, no epoch_size): {why}, or use "
        f"{_loader_line(ds.config.batch_size, 'W')}"
    )
