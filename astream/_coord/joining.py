"""How a client joins its node: connect, or elect itself and start the agent, then hello.

Split from :mod:`astream._coord.client` because the election is one job with its own
hazards (a squatted address, an agent that dies while starting, a hello racing the
start, a cancellation at any of those points) while the client's calls only need "a
live link": :meth:`Joining._connected` is that seam. On a lost agent, every client
rejoins at once (not at its next call), so the new agent learns its pins, epoch and
readers' plans before anyone asks it to evict.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import threading
from collections import Counter
from typing import Any

from astream import errors
from astream._coord.config import CoordConfig
from astream._coord.launch import refused_at_exit, start_agent
from astream._coord.link import AgentLost, Link
from astream._coord.provider import ProviderFactory
from astream._coord.rendezvous import Address, Squatted, try_bind, try_connect
from astream._coord.reports import PlanReports
from astream._storage.loop import within
from astream.errors import CoordinationError, UsageError

__all__ = ["Joining"]

log = logging.getLogger("astream.coord")


class Joining(PlanReports):
    """The joining and re-election of :class:`~astream._coord.client.AsyncNodeClient` (mixed in).

    The client's constructor sets every attribute declared here.
    """

    config: CoordConfig
    member: str
    view: str
    address: Address
    agent_pid: int | None
    started_agents: int
    _provider: ProviderFactory
    _lock: asyncio.Lock | None
    _pins: Counter[str]
    _epoch_hint: int | None
    _closed: bool
    _opened: bool
    _rejoin: asyncio.Task[None] | None

    def _agent_lost(self) -> None:
        """The agent went away: rejoin now, so the next agent learns our pins before it evicts."""
        if self._closed or (self._rejoin is not None and not self._rejoin.done()):
            return
        self._rejoin = asyncio.get_running_loop().create_task(self._rejoin_quietly())

    async def _rejoin_quietly(self) -> None:
        try:
            await self._connected()
        except (errors.AstreamError, OSError) as exc:  # the next call raises it again, to its caller
            log.warning("astream: %s could not rejoin the node: %s", self.member, exc)
        except RuntimeError as exc:
            if not refused_at_exit(exc):
                raise
            log.debug("astream: %s did not rejoin the node, the program is ending: %s", self.member, exc)

    async def _connected(self) -> Link:
        link = self._link
        if link is not None and not link.lost:
            return link
        if self._closed:
            raise UsageError(f"{self!r} is closed")
        if self._lock is None:
            self._lock = asyncio.Lock()
        async with self._lock:
            if self._link is None or self._link.lost:
                self._link = await self._join()
                self._opened = True
            return self._link

    async def _join(self) -> Link:
        """Connect to the agent, electing and starting one if nobody listens."""
        loop = asyncio.get_running_loop()
        deadline = loop.time() + self.config.connect_timeout
        pause = 0.002
        last: BaseException | None = None
        while loop.time() < deadline:
            try:
                sock = try_connect(self.address)
            except Squatted as exc:
                if not exc.address.abstract:
                    raise
                self.address = exc.address.private()  # every process of the node sees it, and follows
                log.warning("astream: %s; meeting at %s instead", exc, self.address)
                continue
            if sock is not None:
                try:
                    return await within(max(0.1, deadline - loop.time()), self._hello(sock))
                except (AgentLost, asyncio.TimeoutError, ConnectionError) as exc:
                    last = exc  # that agent is going away; elect again
            else:
                listener = try_bind(self.address)
                if listener is not None:
                    link = await self._start_and_hello(listener, deadline)
                    if link is not None:
                        return link
                    continue
            await asyncio.sleep(pause)
            pause = min(pause * 2, 0.05)
        raise CoordinationError(
            f"{self.member}: could not reach or start the node agent at {self.address} within "
            f"{self.config.connect_timeout}s (CoordConfig.connect_timeout){f'; last error: {last}' if last else ''}"
        )

    async def _start_and_hello(self, listener: Any, deadline: float) -> Link | None:
        """Start the agent on ``listener`` and say hello to it at once: the connection waits
        in the listener's backlog and the hello in the socket, so the agent answers as soon
        as it serves, without a wake-up of this loop in between (a cold resume waits for
        it). None: connect again (the agent started, but this hello did not get through).

        Raises:
            CoordinationError: the agent did not start (why), or refused the hello.
        """
        loop = asyncio.get_running_loop()
        sock = try_connect(self.address)
        starting = asyncio.ensure_future(self._start_agent(listener))
        if sock is None:  # (the backlog refused it: hello once the agent serves)
            self.agent_pid = await starting
            self.started_agents += 1
            return None
        hello = asyncio.ensure_future(within(max(0.1, deadline - loop.time()), self._hello(sock)))
        try:
            await asyncio.wait({starting, hello}, return_when=asyncio.FIRST_COMPLETED)
            if starting.done():
                self.agent_pid = starting.result()  # raises why the agent did not start
            try:
                link = await hello
            except (AgentLost, asyncio.TimeoutError, ConnectionError):
                self.agent_pid = await starting  # (the reason, if that is why the hello failed)
                self.started_agents += 1
                return None
        except BaseException:
            for task in (hello, starting):
                task.cancel()  # (the agent's own start goes on: it ends once nobody came)
                with contextlib.suppress(BaseException):
                    await task
            raise
        self.started_agents += 1
        # The hello came back, so the agent serves (its pid is in the answer); its start
        # returns in a moment, nobody needs to wait for that.
        starting.add_done_callback(_retrieved)
        return link

    async def _start_agent(self, listener: Any) -> int:
        """Start the node's agent on ``listener`` (off the loop). Cancelled before the agent
        took the listener over, the listener is closed (nobody else would); cancelled after,
        the agent starts all the same and ends once nobody came (``connect_timeout``)."""
        lock = threading.Lock()
        state = {"ran": False, "abandoned": False}

        def start() -> int:
            with lock:
                if state["abandoned"]:
                    return 0
                state["ran"] = True
            return start_agent(listener, self._provider, self.config, self.view)

        task = asyncio.ensure_future(asyncio.to_thread(start))
        try:
            return await asyncio.shield(task)
        except asyncio.CancelledError:
            with lock:
                if not state["ran"]:
                    state["abandoned"] = True
                    listener.close()
            task.add_done_callback(_retrieved)  # (the start goes on: how it ends is nobody's now)
            raise

    async def _hello(self, sock: Any) -> Link:
        loop = asyncio.get_running_loop()
        try:
            _, link = await loop.create_unix_connection(
                lambda: Link(self.config.max_frame, self._agent_lost), sock=sock
            )
        except BaseException:
            sock.close()
            raise
        try:
            answer = await link.request({
                "op": "hello", "member": self.member, "pid": os.getpid(),
                "epoch_hint": self._epoch_hint, "pins": sorted(self._pins), "view": self.view,
            })
        except BaseException as exc:
            link.close()
            if isinstance(exc, CoordinationError) and not isinstance(exc, AgentLost):
                raise CoordinationError(f"{self.member} cannot join the node agent at {self.address}: {exc}") from exc
            raise
        self.agent_pid = answer["agent_pid"]
        self._epoch_hint = answer["epoch"]
        for reader in self._plans:  # a new agent (re-elected) learns the open readers' plans
            self._send_plan(link, reader)
        return link


def _retrieved(task: asyncio.Future[Any]) -> None:
    if not task.cancelled():
        task.exception()  # (a start whose agent answered a hello did not fail)
