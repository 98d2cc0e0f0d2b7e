"""What a loader's readers run: one epoch's share each, picklable for worker processes.

The :class:`Loader` makes one :class:`EpochJob` per epoch; the worker pool opens it once
per worker (a process, a thread, or a stand-in on the consumer's loop), and a loader
without workers opens its one reader with :func:`open_reader`. The dataset a worker reads
is its own: unpickled with the job in a worker process, copied for a thread
(:func:`thread_copy`), so open shards and node clients are never shared between loops.
What cannot travel to a worker process is refused when the loader is made
(:func:`pickled_for_workers`), named, instead of a ``PicklingError`` at the first epoch.
"""

from __future__ import annotations

import copy
import pickle
from collections.abc import AsyncIterator
from contextlib import AbstractAsyncContextManager, asynccontextmanager
from dataclasses import dataclass
from typing import Any, ClassVar

from astream._dataset.dataset import StreamingDataset
from astream._dataset.loader_config import LoaderConfig
from astream._dataset.read.reader import EpochReader, StartAt
from astream.errors import ConfigError

__all__ = ["EpochJob", "open_reader", "pickled_for_workers", "thread_copy"]


@dataclass
class EpochJob:
    """What each loader worker runs: its share of one epoch (picklable)."""

    dataset: StreamingDataset
    epoch: int
    offset: int
    config: LoaderConfig
    skipped: frozenset[int] = frozenset()  # on_bad_sample="skip": ids known to be bad, never read
    # While worker processes start, the consumer reads their first batches itself (see
    # WorkerPool): the first batch no longer waits for interpreters to boot.
    stand_in: ClassVar[bool] = True

    @asynccontextmanager
    async def open(self, worker_id: int, start_at: StartAt | None = None) -> AsyncIterator[AsyncIterator[Any]]:
        # Thread workers share the process: each gets its own copy of the dataset so open
        # shards and node clients are never shared between event loops.
        ds = self.dataset if self.config.processes else thread_copy(self.dataset)
        try:
            async with open_reader(ds, self.epoch, self.offset, worker_id, self.config, self.skipped) as reader:
                yield reader.batches(self.config.collate_fn, start_at=start_at)
        finally:
            await ds.aclose()
            # This worker's dataset is its own (a thread's copy, or unpickled with the job by
            # a stand-in or a worker process): its shard maps hold file descriptors, which
            # must not wait for the garbage collector (an epoch would leak dozens).
            ds.session.shards.close()


def open_reader(
    ds: StreamingDataset, epoch: int, offset: int, worker: int, config: LoaderConfig,
    skipped: frozenset[int] = frozenset(),  # on_bad_sample="skip": the ids known to be bad
    *, joined: bool = True,
) -> AbstractAsyncContextManager[EpochReader]:
    """The reader of one of the loader's readers (a worker's, or the process's own;
    ``joined=False``: on the loop's client as it is, which joins the node at its first call)."""
    return ds.open_epoch_reader(epoch, offset, worker=worker, workers_per_rank=config.readers,
                                batch_size=config.batch_size, drop_last=config.drop_last,
                                batch_transform=config.batch_transform, skipped=skipped, joined=joined)


def pickled_for_workers(dataset: StreamingDataset, **functions: Any) -> bytes:
    """The dataset and the loader's functions as worker processes get them (one pickling);
    what cannot travel is refused now, named, with the fix, instead of a PicklingError at
    the first epoch."""
    try:
        return pickle.dumps((dataset, *functions.values()))
    except Exception as first:
        # Name the culprit: the dataset's transform, a loader function, or the dataset (a
        # subclass may hold what does not pickle).
        named: dict[str, Any] = {"transform": dataset.config.transform, **functions, "the dataset": dataset}
        for name, fn in named.items():
            if fn is None:
                continue
            try:
                pickle.dumps(fn)
            except Exception as exc:
                what = name if name == "the dataset" else f"{name}={getattr(fn, '__qualname__', fn)!r}"
                raise ConfigError(
                    f"{what} cannot be pickled ({type(exc).__name__}: {exc}), so it cannot reach worker "
                    "processes; define it at module level (not a lambda or a nested function), or use "
                    "worker_mode='thread' or num_workers=0"
                ) from exc
        raise ConfigError(f"the loader's job cannot be pickled for worker processes: {first}") from first


def thread_copy(dataset: StreamingDataset) -> StreamingDataset:
    """The dataset for a thread worker: the same configuration (not pickled: a thread needs
    no picklable transform), its own run state and process session."""
    clone = copy.copy(dataset)
    state = dataset.__getstate__()
    state["run"] = copy.deepcopy(dataset.run)
    clone.__setstate__(state)
    return clone
