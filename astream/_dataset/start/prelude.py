"""The start-up prelude: what a dataset does between ``Loader()`` and its first batch.

A dataset's constructor ends once its indexes are read; its first iteration would then
join the node (starting the node agent), agree on the epoch, plan it and ask for the
first batch's shards, one after the other, while the program waited. A program does other
work between the two (it builds and compiles its model), so one :class:`Prelude` per
dataset (made by the first :class:`~astream._dataset.loader.Loader`, with its readers'
shape) does that work then, on astream's loop thread. Its state is one
:class:`~astream._dataset.start.stages.StartBook` (the stages and their transitions are
drawn there); this module is its I/O shell. In order:

1. **The warm start** (:meth:`Prelude.start`): a client of its own joins the node (the agent
   starts there and then, on a thread or in its process), asks which epoch the node begins
   next, and prefetches the shards of the first batch of each of the loader's readers in it,
   marked ``first`` (the node serves every reader's first batch first). The iteration's own
   requests join those transfers, or find them done.
2. **A loaded position** (:meth:`Prelude.moved`, called by
   :class:`~astream._dataset.run.RunState` when ``load_state_dict`` moves it: the load sets the
   position and nothing else, the prelude reacts): the shards of the first batches there are
   prefetched instead (the earlier ones withdrawn: the agent stops a transfer nobody else
   wants), and the read-ahead is triggered: the first row groups there are decoded in the
   background (:func:`~astream._dataset.start.preopen.preopen`). Without a decoding, the
   reader's order of the rest of the epoch is computed then, while the agent starts.
3. **Holds** (:meth:`Prelude.hold`): while a position moves, its row groups decode and batch 0
   is read from them, a start that has not joined the node yet waits (``hold_s`` (tuning.py)
   at most): on two cores the agent's start beside the decode took the interpreter lock from
   it many times a millisecond.
4. **Batch 0 before the join** (:meth:`Prelude.first_position`, :meth:`Prelude.first_batch`):
   where every row group of a loaded position's first batch was decoded, the iteration opens
   its reader at that position on a client that has not joined (its calls held until batch 0
   is read: :mod:`astream._dataset.start.held`), and the reader's batch 0 is read from the
   decodings (its own early source, its own ledger), before the epoch's barrier and before any
   answer of the node agent; the iteration joins after it, while the caller trains on it. The node must begin that epoch and position, or the iteration raises
   :class:`~astream.errors.StateError` (ranks of a node that loaded different states). What the
   batch was read from is checked against the installed file as its lease resolves, like
   every record the reader serves before an install.
5. **The hand-over** (:meth:`Prelude.hand_over`): an iteration began; a loaded position's
   shards not asked for yet are asked for on the iteration's client (one message: it joined
   before the prelude's, which connected while the agent started), and nothing more is planned.

Everything it does is a hint: a failure is logged at debug level and met again, with its
error, by the iteration that needs the same thing. :meth:`Prelude.astop` (the dataset's
``close``/``aclose``) and :meth:`Prelude.stop_soon` (the dataset collected unclosed) make its
client leave the node, which withdraws what it prefetched and nobody else wants. It belongs
to the process that made it: a dataset pickled into a worker has none, and in a forked child
it does nothing (its loop does not exist there). Nothing in it refers to the dataset.

Where batch 0 comes before the join: a loaded state not begun yet, an unbounded cache, every
row group of that batch decoded (Parquet, within ``preopen``'s budgets), one reader per rank,
no per-sample steps (``transform``, a subclass's ``__getitem__``), no ``collate_fn`` and no
skip mode. Otherwise, or if a decoding failed, the iteration joins first, as every other does.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
from collections.abc import AsyncIterator, Awaitable, Callable, Coroutine, Sequence
from concurrent.futures import Future, InvalidStateError
from dataclasses import dataclass, field
from typing import Any

from astream._coord.client import AsyncNodeClient
from astream._dataset import tuning
from astream._dataset.layout import SampleMap
from astream._dataset.planner import Planner, ReaderShape
from astream._dataset.read.shards import OpenShards
from astream._dataset.run import RunState
from astream._dataset.start.stages import Stage, StartBook
from astream._dataset.state import EpochState
from astream._storage.loop import LoopThread, within
from astream.errors import StateError

__all__ = ["Decodings", "FirstAt", "Prelude", "check_began"]

log = logging.getLogger("astream.dataset")

# The read-ahead a loaded position triggers: the decodings of its first row groups, offered
# to the process's open shards (:func:`~astream._dataset.start.preopen.preopen`), of the
# shards (keys) read first there, in order; returns them, at once.
Decodings = Callable[[list[str]], Sequence[Future[Any]]]


def _open(gate: Future[None]) -> None:
    with contextlib.suppress(InvalidStateError):  # (opened already)
        gate.set_result(None)


@dataclass
class FirstAt:
    """A loaded position whose batch 0 the iteration's reader reads before the join, held
    until :meth:`release` (idempotent): the prelude's start, and the iteration's own client
    (``read``: done once batch 0 is read; see :mod:`astream._dataset.start.held`)."""

    epoch: int
    offset: int
    _release: Callable[[], None] | None = field(default=None, repr=False)
    read: Future[None] = field(default_factory=Future, repr=False)

    def release(self) -> None:
        _open(self.read)
        release, self._release = self._release, None
        if release is not None:
            release()


class Prelude:
    """One dataset's start-up (see the module's docstring).

    Args:
        portal: the loop thread it runs on (the process's astream loop).
        client: makes its node client (called on that loop).
        planner, run, smap, shards: the dataset's plans, run state and sample map, and this
            process's open shards (none refers to the dataset).
        read_ahead: the read-ahead a loaded position triggers (its decodings).
        per_sample: the dataset reads each sample through its steps (a transform, a
            subclass's ``__getitem__``), or skips bad samples: no batch 0 before the join.
    """

    def __init__(self, portal: LoopThread, client: Callable[[], AsyncNodeClient], planner: Planner, run: RunState,
                 smap: SampleMap, shards: OpenShards, read_ahead: Decodings, *, per_sample: bool) -> None:
        self.book = StartBook()
        self.shape = ReaderShape(1, 1, False)
        self._portal = portal
        self._make_client = client
        self._planner, self._run, self._smap, self._shards = planner, run, smap, shards
        self._read_ahead = read_ahead
        self._per_sample = per_sample
        self._pid = os.getpid()
        self._client: AsyncNodeClient | None = None
        self._tasks: set[asyncio.Task[None]] = set()
        self._lock: asyncio.Lock | None = None
        self._gate: Future[None] = Future()  # joining waits while it is not done (see hold)
        self._gate.set_result(None)
        self._holding = threading.Lock()

    # -- from the caller's thread ------------------------------------------------------------
    def start(self, shape: ReaderShape) -> None:
        """A loader of ``shape`` was made: start in the background (the first), or move a loaded
        position's prefetch to this shape's first batches (another loader)."""
        self.shape = shape
        if self.book.start():
            self._submit(self._start(), planned=True)
        elif (resume := self._run.resume) is not None:
            self._redirect(self._planner.first_keys(shape, resume.epoch, resume.sample_in_epoch))

    def moving(self) -> None:
        """(RunState's watch) A state is being loaded: held until :meth:`moved`."""
        self.hold()

    def moved(self, state: EpochState | None) -> None:
        """(RunState's watch) The position moved to ``state`` (None: the load failed): prefetch
        its first batches instead, trigger the read-ahead of its first row groups (held until
        they are decoded), or, without any, compute the reader's order now."""
        decoding: list[Future[Any]] = []
        try:
            if state is None:
                return
            # (the plan, which the iteration needs anyway, is then cached for it)
            keys = self._planner.first_keys(self.shape, state.epoch, state.sample_in_epoch)
            # The decode first: the redirect wakes the loop thread, whose work would delay this
            # thread's start.
            decoding = list(self._read_ahead(keys))
            self._redirect(keys, after=decoding)
        finally:
            self.release()
        if state is not None and not decoding:
            self._planner.reader_order(self.shape, state.epoch, state.sample_in_epoch)

    def hold(self) -> None:
        """Keep a start that has not joined the node yet from joining it until as many
        :meth:`release` calls (at most ``hold_s`` (tuning.py)); holds count, from any thread."""
        with self._holding:
            if self.book.hold() and self._gate.done():
                self._gate = Future()

    def release(self) -> None:
        """End one :meth:`hold`."""
        with self._holding:
            gate = self._gate if self.book.release() else None
        if gate is not None:
            _open(gate)

    def _redirect(self, keys: list[str], after: Sequence[Future[Any]] = ()) -> None:
        self.book.move(keys)  # a start still joining or planning skips the rest
        for future in after:
            self.hold()
            future.add_done_callback(lambda _: self.release())  # (at once if done already)
        self._submit(self._prefetch(keys, planned=False), planned=False)

    # -- the iteration (on its loop) -----------------------------------------------------------
    async def first_position(self, shape: ReaderShape, collate: object | None) -> FirstAt | None:
        """The loaded position whose batch 0 (of a loader of ``shape`` with ``collate``) is read
        before the join, once every row group it reads is decoded, held; None where that does
        not apply (see the module's docstring), or a decoding failed."""
        resume = self._run.resume
        if resume is None or shape.readers != 1 or collate is not None or self._per_sample:
            return None
        ids = self._planner.first_ids(shape, resume.epoch, resume.sample_in_epoch)[0]
        offers = [self._shards.offered(shard) for shard in dict.fromkeys(self._smap.locate(ids)[0].tolist())]
        if not offers or any(f is None for f in offers):
            return None
        self.hold()
        first = FirstAt(resume.epoch, resume.sample_in_epoch, self.release)
        decodings = [asyncio.wrap_future(f) for f in offers if f is not None]
        try:
            await asyncio.wait(decodings)
        except BaseException:
            first.release()
            raise
        if any(d.cancelled() or d.exception() is not None for d in decodings):
            first.release()  # (a hint: the iteration reads the installed file, with its errors)
            return None
        return first

    async def first_batch(self, first: FirstAt, batches: AsyncIterator[Any],
                          join: Callable[[], Awaitable[tuple[int, int]]]) -> AsyncIterator[Any]:
        """The reader's ``batches`` from ``first``: batch 0 before the node is joined (held), then
        ``join`` (the epoch's barrier: it must begin ``first``), then the rest."""
        it = batches.__aiter__()
        try:
            batch, more = await it.__anext__(), True
        except StopAsyncIteration:
            batch, more = None, False
        finally:
            first.release()
        if more:
            yield batch
        check_began(first, *await join())
        if more:
            async for batch in it:
                yield batch

    async def hand_over(self, node: AsyncNodeClient) -> None:
        """An iteration has begun, its client ``node`` joined: plan and prefetch nothing more
        (the reader asks for its shards). A loaded position's shards are asked for on ``node``
        now (one message): the iteration's client joins the node before the prelude's (it
        connected while the agent was starting), so the transfer overlaps the iteration's
        barrier and its reader's set-up instead of following them."""
        keys = self.book.hand_over()
        if keys is None or os.getpid() != self._pid:
            return
        try:
            await node.prefetch(keys, first=True)
        except Exception as exc:  # a hint: the iteration's own calls meet it, with its error
            log.debug("astream: the prelude's hand-over failed: %s", exc)

    async def astop(self) -> None:
        """Stop, on the loop it runs on: its client leaves the node; idempotent."""
        if os.getpid() != self._pid:
            return
        self.book.stop()
        tasks = [t for t in self._tasks if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()

    async def astop_anywhere(self) -> None:
        """:meth:`astop` on the process's loop thread, from any loop (that one included)."""
        if asyncio.get_running_loop() is self._portal.loop:
            await self.astop()
        else:
            await asyncio.wrap_future(self._portal.submit(self.astop()))

    def stop_soon(self) -> None:
        """:meth:`astop` from any thread, without waiting (a finalizer's)."""
        loop = self._portal.loop
        if os.getpid() != self._pid or self.book.stage is Stage.STOPPED or loop.is_closed():
            return
        with contextlib.suppress(RuntimeError):  # the loop stopped meanwhile (interpreter exit)
            loop.call_soon_threadsafe(lambda: loop.create_task(self.astop()))

    # -- on the loop thread --------------------------------------------------------------------
    def _submit(self, coro: Coroutine[Any, Any, None], *, planned: bool) -> None:
        if os.getpid() != self._pid or self.book.stage is Stage.STOPPED:
            coro.close()
            return
        try:
            self._portal.submit(self._tracked(coro, planned))
        except Exception:  # (a closed loop thread: nothing to start any more)
            coro.close()

    async def _tracked(self, coro: Coroutine[Any, Any, None], planned: bool) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        if self._lock is None:
            self._lock = asyncio.Lock()
        try:
            async with self._lock:  # in the order they were asked for
                if self.book.may_run(planned):
                    await coro
        except Exception as exc:
            log.debug("astream: the dataset's start-up prelude stopped: %s", exc)
        finally:
            coro.close()  # (never started, if stopped first)
            self._tasks.discard(task)

    async def _joined(self) -> AsyncNodeClient:
        if self._client is None:
            gate = self._gate
            if not gate.done():
                with contextlib.suppress(TimeoutError, asyncio.TimeoutError):  # (a hint: never waited for long)
                    await within(tuning.READ_AHEAD.hold_s, asyncio.shield(asyncio.wrap_future(gate)))
            self._client = self._make_client()
        await self._client.aconnect()
        return self._client

    async def _start(self) -> None:
        client = await self._joined()
        if not self.book.may_plan():
            return  # the iteration asks, or a loaded position's prefetch (queued behind) goes now
        epoch = await client.get_epoch()
        if not self.book.may_plan():
            return
        keys = await asyncio.to_thread(self._planner.first_keys, self.shape, epoch)  # may plan: not on the loop
        await self._prefetch(keys, planned=True)

    async def _prefetch(self, keys: list[str], *, planned: bool) -> None:
        client = await self._joined()
        step = self.book.prefetch(keys, planned=planned)
        if step is None:
            return
        if step.withdraw:
            await client.withdraw(step.withdraw)
        if step.ask:
            await client.prefetch(step.ask, first=True)


def check_began(first: FirstAt, epoch: int, offset: int) -> None:
    """Refuse an iteration that began elsewhere than the position of its batch 0.

    Raises:
        StateError: the node began another epoch or position (its ranks loaded different states).
    """
    if (epoch, offset) != (first.epoch, first.offset):
        raise StateError(
            f"the node began epoch {epoch} at sample {offset}, but this rank resumed epoch {first.epoch} at "
            f"sample {first.offset} and handed out that state's first batch already: the ranks of a node "
            "loaded different states; load the same state on every rank"
        )
