"""``WarmStart``: a new dataset joins its node and fetches its first batch in the background.

A dataset's constructor ends once its indexes are read. Its first iteration would then
join the node (starting the node agent), agree on the epoch, plan it and ask for the
first batch's shards, one after the other, while the program waited. A program does
other work between the two (it builds and compiles its model), so the constructor starts
that work instead, on astream's loop thread: a client of its own joins the node (the
agent starts there and then, on a thread or in its process), asks which epoch the node
begins next, and prefetches the shards this rank's first batch reads in it, marked
``first`` (the node serves every reader's first batch first). The iteration's own
requests join those transfers, or find them done.

Everything it does is a hint. A failure is logged at debug level and met again, with its
proper error, by the iteration that needs the same thing; the constructor raises what it
raised before, and nothing more.

- :meth:`WarmStart.redirect`: a state loaded before the first iteration moves it to the
  resume point: the shards found there are prefetched, and the earlier ones withdrawn (the
  agent stops a transfer nobody else wants, already running or not). A start still joining
  then neither asks for the epoch nor plans it.
- :meth:`WarmStart.hold` / :meth:`WarmStart.release`: while a state is being loaded, its
  first batch's row groups decoded (:mod:`astream._dataset.start.preopen`) and that batch taken
  from them (:mod:`astream._dataset.start.early`), a start that has not joined the node yet
  waits (``hold_s`` (tuning.py) at most): on two cores the agent's start beside the decode took
  the interpreter lock from it many times a millisecond, and it woke up first when the
  decode ended, before the thread waiting for the batch.
- :meth:`WarmStart.astop` (the dataset's ``close``/``aclose``) and :meth:`WarmStart.stop_soon`
  (the dataset collected unclosed): its client leaves the node, which withdraws what it
  prefetched and nobody else wants; a node agent on a thread of this process then ends
  after its linger, as it would after an iteration.
- :meth:`WarmStart.hand_over`: an iteration began (its client joined): what is left, the
  iteration asks for itself, and the warm start stays out of its way (no second planning,
  no request after the reader's). A loaded state's shards not yet asked for are asked
  for then, on the iteration's client: ``Loader(); load_state_dict(); next()`` in a row
  is a resume, where the iteration's client joins before this start's (it connects while
  the agent starts), and the barrier and the reader's set-up come before the reader's own
  request; the transfer overlaps them instead. (Where the first batch's row groups are
  decoded ahead, that batch is taken before the iteration joins: astream._dataset.start.early.)
- It belongs to the process that made it. A dataset pickled into a worker has none (the
  worker's iteration asks for its own shards), and in a forked child it does nothing: the
  loop it ran on does not exist there.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
from collections.abc import Callable, Coroutine, Sequence
from concurrent.futures import Future, InvalidStateError
from typing import Any

from astream._coord.client import AsyncNodeClient
from astream._dataset import tuning
from astream._storage.loop import LoopThread, within

__all__ = ["WarmStart"]

log = logging.getLogger("astream.dataset")

# The shards of this rank's first batch in the node's next epoch (computed off the loop).
KeysAt = Callable[[int], list[str]]


def _open(gate: Future[None]) -> None:
    with contextlib.suppress(InvalidStateError):  # (opened already)
        gate.set_result(None)


class WarmStart:
    """One dataset's background start: a node client of its own, and what it prefetched.

    Args:
        portal: the loop thread it runs on (the process's astream loop).
        client: makes its node client (called on that loop).
    """

    def __init__(self, portal: LoopThread, client: Callable[[], AsyncNodeClient]) -> None:
        self._portal = portal
        self._make_client = client
        self._pid = os.getpid()
        self._client: AsyncNodeClient | None = None
        self._keys: list[str] = []
        self._tasks: set[asyncio.Task[None]] = set()
        self._lock: asyncio.Lock | None = None
        self._stopped = False
        self._redirected = False
        self._overtaken = False
        self._resume_keys: list[str] | None = None  # a loaded state's first shards
        self._gate: Future[None] = Future()  # joining waits while it is not done (see hold)
        self._gate.set_result(None)
        self._holds = 0
        self._holding = threading.Lock()
        self._handed: list[str] | None = None  # those the iteration asked for itself

    def start(self, keys_at: KeysAt) -> None:
        """Join the node and prefetch ``keys_at(the node's next epoch)``, in the background."""
        self._submit(self._start(keys_at))

    def hold(self) -> None:
        """Keep what has not joined the node yet from joining it until as many
        :meth:`release` calls (at most ``hold_s`` (tuning.py)); holds count, from any thread."""
        with self._holding:
            self._holds += 1
            if self._gate.done():
                self._gate = Future()

    def release(self) -> None:
        """End one :meth:`hold`."""
        with self._holding:
            self._holds -= 1
            gate = self._gate if self._holds == 0 else None
        if gate is not None:
            _open(gate)

    def redirect(self, keys: list[str], after: Sequence[Future[Any]] = ()) -> None:
        """Prefetch ``keys`` instead of what was prefetched so far (a loaded state's), once
        every future of ``after`` is done (the decodings a first batch is taken from: held
        until then)."""
        self._redirected = True  # a start still joining or planning skips the rest
        self._resume_keys = list(keys)
        for future in after:
            self.hold()
            future.add_done_callback(lambda _: self.release())  # (at once if done already)
        self._submit(self._prefetch(keys, overtaken_ok=True), overtaken_ok=True)

    async def hand_over(self, node: AsyncNodeClient) -> None:
        """An iteration has begun, its client ``node`` joined: plan and prefetch nothing more
        (the reader asks for its shards). A loaded state's shards are asked for on ``node``
        now (one message): the iteration's client joins the node before this start's (it
        connected while the agent was starting), so the transfer overlaps the iteration's
        barrier and its reader's set-up instead of following them."""
        self._overtaken = True
        keys = self._resume_keys
        if keys is None or self._handed is not None or self._stopped or os.getpid() != self._pid:
            return
        self._handed = keys
        try:
            await node.prefetch(keys, first=True)
        except Exception as exc:  # a hint: the iteration's own calls meet it, with its error
            log.debug("astream: the warm start's hand-over failed: %s", exc)

    async def astop(self) -> None:
        """Stop, on the loop it runs on: its client leaves the node; idempotent."""
        if os.getpid() != self._pid:
            return
        self._stopped = True
        tasks = [t for t in self._tasks if t is not asyncio.current_task()]
        for task in tasks:
            task.cancel()
        if tasks:
            await asyncio.wait(tasks)
        client, self._client = self._client, None
        if client is not None:
            await client.aclose()

    def stop_soon(self) -> None:
        """:meth:`astop` from any thread, without waiting (a finalizer's)."""
        loop = self._portal.loop
        if os.getpid() != self._pid or self._stopped or loop.is_closed():
            return
        with contextlib.suppress(RuntimeError):  # the loop stopped meanwhile (interpreter exit)
            loop.call_soon_threadsafe(lambda: loop.create_task(self.astop()))

    # -- on the loop ------------------------------------------------------------------------
    def _submit(self, coro: Coroutine[Any, Any, None], *, overtaken_ok: bool = False) -> None:
        if os.getpid() != self._pid or self._stopped:
            coro.close()
            return
        try:
            self._portal.submit(self._tracked(coro, overtaken_ok))
        except Exception:  # (a closed loop thread: nothing to warm up any more)
            coro.close()

    async def _tracked(self, coro: Coroutine[Any, Any, None], overtaken_ok: bool) -> None:
        task = asyncio.current_task()
        assert task is not None
        self._tasks.add(task)
        if self._lock is None:
            self._lock = asyncio.Lock()
        try:
            async with self._lock:  # in the order they were asked for
                if not self._stopped and (overtaken_ok or not self._overtaken):
                    await coro
        except Exception as exc:
            log.debug("astream: the dataset's warm start stopped: %s", exc)
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

    async def _start(self, keys_at: KeysAt) -> None:
        client = await self._joined()
        if self._overtaken or self._redirected:
            return  # the iteration asks, or a loaded state's prefetch (queued behind) goes now
        epoch = await client.get_epoch()
        if self._overtaken or self._redirected:
            return
        keys = await asyncio.to_thread(keys_at, epoch)  # may plan the epoch: not on the loop
        if not self._redirected:
            await self._prefetch(keys)

    async def _prefetch(self, keys: list[str], *, overtaken_ok: bool = False) -> None:
        client = await self._joined()
        if self._overtaken and not overtaken_ok:
            return
        dropped = sorted(set(self._keys) - set(keys))
        if dropped:
            await client.withdraw(dropped)
        self._keys = list(keys)
        if keys == self._handed:
            return  # the iteration asked for them on its own client
        if keys:
            await client.prefetch(keys, first=True)
