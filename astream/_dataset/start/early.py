"""A resume's first batch, taken from row groups decoded ahead, before the node agent answers.

``Loader(); load_state_dict(); next()`` is how a training script resumes. The row groups
of the state's first batch are read and decoded at ``load_state_dict``
(:mod:`astream._dataset.start.preopen`); with them the first batch needs nothing from the node.
Without this module it still waited for the node: the agent's start, the iteration's
hello, the epoch's barrier and the reader's set-up, about half of a resume's time on two
cores, where every one of those steps takes the interpreter lock from the decode.

:func:`early_first_batch` names the batch and the decodings it needs;
:meth:`EarlyFirst.take` (or :meth:`EarlyFirst.atake` on a loop) takes it in the iterating
thread as soon as they are done, the node's start held meanwhile. The iteration (joining
the node, the barrier, the reader) starts after it, while the caller trains on it, and is
told to skip that batch and to check what it was made of
(:meth:`~astream._dataset.read.reader.EpochReader.batches`, ``served_first``).

How it stays exact:

- the batch is batch 0 of the same :func:`~astream._sampling.order.worker_batches` the
  iteration's reader then reads, from the plan of the loaded state's epoch and sample
  (:func:`~astream._sampling.order.first_batch` computes only that batch where the plan
  allows it), read by the reader's own function
  (:func:`~astream._dataset.read.assembly.read_positions`);
- every row group it was read from is noted in a
  :class:`~astream._dataset.read.ledger.ServedLedger` (the xxh3 of the bytes decoded), which
  the reader takes over and checks against the file the agent installs: a difference raises
  :class:`~astream.errors.ServedSamplesError` at a later batch, as for every sample
  served before its shard was installed;
- if the node begins another epoch or position than the state's (ranks of one node that
  loaded different states), the iteration raises :class:`~astream.errors.StateError`
  instead of going on after a batch that was not its first.

Where it applies: a loaded state not begun yet, an unbounded cache, every shard of the
first batch offered by :func:`~astream._dataset.start.preopen.preopen` (Parquet row groups within
its budgets), no loader workers, no per-sample steps (``transform``, a subclass's
``__getitem__``) and no ``collate_fn``: those read sample by sample, through the
iteration. Otherwise, or if a decoding failed, the iteration reads the first batch itself,
as before.
"""

from __future__ import annotations

import asyncio
import contextlib
from collections.abc import Iterator
from concurrent.futures import Future, wait
from dataclasses import dataclass
from typing import Any, Protocol

import numpy as np
import numpy.typing as npt

from astream._dataset.layout import SampleMap
from astream._dataset.read.assembly import read_positions
from astream._dataset.read.ledger import ServedLedger
from astream._dataset.read.shards import Decoded, OpenShards
from astream.errors import StateError

__all__ = ["EarlyBatch", "EarlyFirst", "ServedFirst", "check_began", "early_first_batch"]

Int64Array = npt.NDArray[np.int64]


class Holds(Protocol):
    """What keeps the node's start waiting while a first batch is taken (a dataset's warm start)."""

    def hold(self) -> None: ...

    def release(self) -> None: ...


@dataclass(frozen=True)
class ServedFirst:
    """What the iteration must know of a first batch handed out before it began.

    Attributes:
        epoch: the loaded state's epoch, which the iteration must begin.
        offset: its ``sample_in_epoch``, where the iteration must start.
        served: what the batch was read from (per global shard, the decoding's digest).
    """

    epoch: int
    offset: int
    served: ServedLedger


@dataclass(frozen=True)
class EarlyBatch:
    """A first batch (a dict of columns) and what its iteration must know of it."""

    batch: dict[str, Any]
    served: ServedFirst


class EarlyFirst:
    """A reader's first batch whose every shard is being decoded ahead: take it once they are.

    Args:
        epoch, offset: the loaded state's epoch and ``sample_in_epoch``.
        where, offsets: the shard and record of each sample of the batch, in order.
        offers: the decoding of each of those shards.
    """

    def __init__(self, epoch: int, offset: int, where: Int64Array, offsets: Int64Array,
                 offers: dict[int, Future[Decoded]], holds: Holds | None = None) -> None:
        self._epoch, self._offset = epoch, offset
        self._where, self._offsets = where, offsets
        self._offers = offers
        self._holds = holds

    def take(self) -> EarlyBatch | None:
        """The batch, waiting for the decodings (their thread holds no lock this one needs);
        None if one failed (a hint: the iteration then reads the installed file, with its errors)."""
        with self._held():
            wait(self._offers.values())
            return self._taken()

    async def atake(self) -> EarlyBatch | None:
        """:meth:`take` on an event loop (the loop goes on while the decodings end)."""
        with self._held():
            await asyncio.wait([asyncio.wrap_future(f) for f in self._offers.values()])
            return self._taken()

    @contextlib.contextmanager
    def _held(self) -> Iterator[None]:
        """The node's start waits while the batch is taken (see astream._dataset.start.warmup)."""
        holds = self._holds
        if holds is None:
            yield
            return
        holds.hold()
        try:
            yield
        finally:
            holds.release()

    def _taken(self) -> EarlyBatch | None:
        offers = self._offers
        if any(f.cancelled() or f.exception() is not None for f in offers.values()):
            return None
        decoded = {shard: offered.result() for shard, offered in offers.items()}
        batch = read_positions(self._where, self._offsets, lambda shard: decoded[shard][0])
        served = ServedLedger()
        for shard, (_, digest) in decoded.items():
            served.note_decoded(shard, digest)
        return EarlyBatch(batch, ServedFirst(self._epoch, self._offset, served))


def early_first_batch(epoch: int, offset: int, ids: Int64Array, smap: SampleMap,
                      shards: OpenShards, holds: Holds | None = None) -> EarlyFirst | None:
    """The batch of samples ``ids`` (a reader's first: :func:`~astream._sampling.order.first_batch`)
    from the decodings offered to ``shards``, to take once they end (``holds``: held while
    it is taken); None where one is missing, or ``ids`` is empty."""
    if not len(ids):
        return None
    where, offsets = smap.locate(ids)
    offers = {}
    for shard in dict.fromkeys(where.tolist()):
        offered = shards.offered(shard)
        if offered is None:
            return None
        offers[shard] = offered
    return EarlyFirst(epoch, offset, where, offsets, offers, holds)


def check_began(early: ServedFirst, epoch: int, offset: int) -> None:
    """Refuse an iteration that began elsewhere than the early batch's state.

    Raises:
        StateError: the node began another epoch or position (its ranks loaded different states).
    """
    if (epoch, offset) != (early.epoch, early.offset):
        raise StateError(
            f"the node began epoch {epoch} at sample {offset}, but this rank resumed epoch {early.epoch} at "
            f"sample {early.offset} and handed out that state's first batch already: the ranks of a node "
            "loaded different states; load the same state on every rank"
        )
