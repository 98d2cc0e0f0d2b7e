"""The node agent: one per node and run, serving every rank and worker of the node.

It deduplicates ``ensure`` (one download per shard per node, every waiter answered,
errors forwarded to all), counts pins node-wide and releases a connection's pins when it
closes, runs barriers (:mod:`.barriers`) and the node's epoch counter, and answers
``inspect`` questions for the clients' watchdogs. It owns no cache logic: that is the
:class:`~astream._coord.provider.ShardProvider`'s.

Each connection is a :class:`~astream._coord.connection.Conn` (a malformed frame closes
that connection only). Readers of a bounded cache also report their epoch's shard uses and
their position (ops ``plan``, ``progress``, ``reader_done``); the agent hands them to a
:class:`~astream._coord.provider.PlanAware` provider and forgets a connection's readers
when it closes, as it releases its pins.

A ``prefetch`` starts a fetch nobody waits for yet; it lasts while the connection that
asked stays and does not ``withdraw`` it (a fetch that no prefetch, waiter or pin wants
any more is cancelled). Requests marked ``first`` (a reader's first batch) go to the
provider's :class:`~astream._coord.provider.Hurried` side, which serves them before the rest.
"""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import time
from collections import Counter
from collections.abc import Callable
from typing import Any

from astream._coord.barriers import Arrival, Barrier, BarrierBook
from astream._coord.config import CoordConfig
from astream._coord.connection import Conn, Wait, error_body, socket_file
from astream._coord.provider import Hurried, PlanAware, Rechecked, ShardProvider
from astream._coord.shards import ShardDesk
from astream._coord.wire import ProtocolError
from astream.errors import CoordinationError

__all__ = ["Agent"]

log = logging.getLogger("astream.coord")


class Agent(ShardDesk):
    """The node agent's state and request handling, bound to one event loop.

    Its shard requests (fetches, pins, prefetches) are :class:`~astream._coord.shards.ShardDesk`'s.

    Args:
        provider: the node's shard cache.
        config: timeouts (``agent_linger``, ``connect_timeout``) and limits.
        view: the identity of the one dataset it serves (the clients' address is derived
            from it too); a client whose hello names another is refused.
    """

    def __init__(self, provider: ShardProvider, config: CoordConfig, view: str = "") -> None:
        self.provider = provider
        self.config = config
        self.view = view
        self.barriers = BarrierBook()
        self.stats: Counter[str] = Counter()
        self.allowed_uid = os.getuid()  # only processes of this user may join
        self._conns: dict[int, Conn] = {}
        self._planned: PlanAware | None = provider if isinstance(provider, PlanAware) else None
        self._hurried: Hurried | None = provider if isinstance(provider, Hurried) else None
        self._rechecked: Rechecked | None = provider if isinstance(provider, Rechecked) else None
        self._warned_twins: set[str] = set()
        self._count = 0
        self._pins: Counter[str] = Counter()
        self._inflight: dict[str, asyncio.Task[str]] = {}
        self._prefetched: dict[str, set[int]] = {}  # key -> the connections whose prefetch wants it
        self._closing = False
        self._waiters: dict[str, list[Wait]] = {}
        self._stage: dict[str, tuple[str, float]] = {}
        self._epoch = 0
        self._epoch_set = False
        self._started = time.monotonic()
        self._stop: asyncio.Event | None = None
        self._socket_file: tuple[str, int] | None = None
        self._idle: asyncio.TimerHandle | None = None
        self._deadline: asyncio.TimerHandle | None = None

    # -- lifecycle ----------------------------------------------------------------------

    async def serve(self, listener: socket.socket, on_ready: Callable[[], None] | None = None) -> None:
        """Rebuild from disk, serve ``listener`` until idle for ``agent_linger``, clean up.

        Args:
            listener: a bound, listening Unix socket; closed on return.
            on_ready: called with no argument once the agent accepts clients.
        """
        loop = asyncio.get_running_loop()
        self._stop = asyncio.Event()
        self._socket_file = socket_file(listener)
        server = None
        try:
            await self.provider.rebuild()
            server = await loop.create_unix_server(self._new_conn, sock=listener)
            if on_ready is not None:
                on_ready()
            self._arm_idle(self.config.connect_timeout)  # nobody came: the leader died early
            await self._stop.wait()
        finally:
            await asyncio.shield(self._shutdown(server, listener))

    def stop(self) -> None:
        """Ask :meth:`serve` to return (idempotent)."""
        if self._stop is not None:
            self._stop.set()

    async def _shutdown(self, server: asyncio.AbstractServer | None, listener: socket.socket) -> None:
        self._closing = True
        if server is not None:
            server.close()
        listener.close()
        if self._socket_file is not None:
            path, inode = self._socket_file
            with contextlib.suppress(OSError):
                if os.stat(path).st_ino == inode:  # still ours, not a successor's
                    os.unlink(path)
        for conn in list(self._conns.values()):
            conn.close()
        for task in self._inflight.values():
            task.cancel()
        if self._inflight:
            await asyncio.gather(*self._inflight.values(), return_exceptions=True)
        await self.provider.aclose()

    def _new_conn(self) -> Conn:
        self._count += 1
        return Conn(self, self._count)

    def _arm_idle(self, delay: float) -> None:
        if self._idle is not None:
            self._idle.cancel()
        self._idle = asyncio.get_running_loop().call_later(delay, self.stop)

    def connected(self, conn: Conn) -> None:
        """A client connected."""
        self._conns[conn.number] = conn
        self.stats["connections"] += 1
        if self._idle is not None:
            self._idle.cancel()
            self._idle = None

    def disconnected(self, conn: Conn) -> None:
        """A client's connection closed: release its pins, tell its barriers."""
        if self._conns.pop(conn.number, None) is None:
            return
        try:
            self._release(conn)
        finally:  # whatever the books say, the last client's leaving starts the linger
            if not self._conns:
                self._arm_idle(self.config.agent_linger)

    def _release(self, conn: Conn) -> None:
        for key in conn.pins:
            self._add_pins(key, -1)
        conn.pins.clear()
        self._withdraw(conn, [k for k, conns in self._prefetched.items() if conn.number in conns])
        if self._planned is not None:
            for reader in conn.readers:
                self._planned.on_reader_gone(f"{conn.number}:{reader}")
        conn.readers.clear()
        for waiters in self._waiters.values():
            waiters[:] = [w for w in waiters if w.conn is not conn]
        if conn.greeted:
            if not conn.clean:
                log.info("astream agent: %s (pid %d) left without goodbye", conn.member, conn.pid)
            for barrier, error in self.barriers.disconnected(conn.member, clean=conn.clean, now=time.monotonic()):
                self._answer_barrier(barrier, error=error)

    # -- requests -----------------------------------------------------------------------

    def dispatch(self, conn: Conn, msg: dict[str, Any]) -> None:
        """Handle one validated request."""
        op = msg["op"]
        self.stats[f"op_{op}"] += 1
        if op == "hello":
            self._hello(conn, msg)
            return
        if not conn.greeted:
            raise ProtocolError(f"op {op!r} before hello")
        request: int = msg.get("id", 0)
        first = bool(msg.get("first"))
        if op == "ensure":
            self._ensure(conn, [msg["key"]], request, pin=msg["pin"], single=True, first=first)
        elif op == "ensure_many":
            self._ensure(conn, msg["keys"], request, pin=msg["pin"], single=False, first=first)
        elif op == "prefetch":
            self._prefetch(conn, msg["keys"], first=first)
        elif op == "withdraw":
            self._withdraw(conn, msg["keys"])
        elif op == "pin":
            self._pin(conn, msg["key"], 1)
        elif op == "unpin":
            self._pin(conn, msg["key"], -1)
        elif op in ("barrier", "begin_epoch"):
            self._arrive(conn, msg, request)
        elif op == "set_epoch":
            self._epoch, self._epoch_set = msg["epoch"], True
            conn.send({"id": request, "ok": True, "epoch": self._epoch})
        elif op == "get_epoch":
            conn.send({"id": request, "ok": True, "epoch": self._epoch})
        elif op == "missing":
            self._missing(conn, msg["key"], request)
        elif op == "inspect":
            conn.send({"id": request, "ok": True, **self.inspect_shard(msg["key"])})
        elif op == "inspect_barrier":
            conn.send({"id": request, "ok": True, **self.inspect_barrier(msg["name"])})
        elif op == "stats":
            conn.send({"id": request, "ok": True, "stats": self.snapshot()})
        elif op == "bye":
            conn.clean = True
        elif op in ("plan", "progress", "reader_done"):
            self._reader_report(conn, msg)

    def _hello(self, conn: Conn, msg: dict[str, Any]) -> None:
        if conn.greeted:
            raise ProtocolError("second hello on one connection")
        view = msg.get("view") or ""
        if view != self.view:
            # Its keys would name this dataset's shards: it would read another dataset's data.
            conn.send({"id": msg["id"], "ok": False, "error": error_body(CoordinationError(
                f"{msg['member']} (pid {msg['pid']}) reads dataset {view or '(none)'} but this node agent serves "
                f"dataset {self.view or '(none)'}; two datasets never share an agent: check that every process "
                "of the node runs the same astream version"))})
            return
        conn.greeted, conn.member, conn.pid = True, msg["member"], msg["pid"]
        self.barriers.joined(conn.member)
        hint = msg["epoch_hint"]
        if hint is not None and not self._epoch_set:
            self._epoch = max(self._epoch, hint)  # a new agent learns the epoch from its clients
        for key in msg["pins"]:
            self._pin(conn, key, 1)
        conn.send({"id": msg["id"], "ok": True, "agent_pid": os.getpid(), "epoch": self._epoch})

    def _reader_report(self, conn: Conn, msg: dict[str, Any]) -> None:
        """A reader's plan, position or end, for a provider that evicts by next use."""
        if self._planned is None:
            return
        reader = f"{conn.number}:{msg['reader']}"  # unique on the node, gone with the connection
        op = msg["op"]
        if op == "plan":
            uses, starts, ends = msg["uses"], msg["starts"], msg["ends"]
            if not len(uses) == len(starts) == len(ends):
                raise ProtocolError("op 'plan': uses, starts and ends differ in length")
            conn.readers.add(msg["reader"])
            if msg["first"]:
                self._planned.on_plan(reader, uses, starts, ends, msg["window"])
            else:
                self._planned.append_plan(reader, uses, starts, ends)
        elif op == "progress":
            self._planned.on_progress(reader, msg["position"])
        else:
            conn.readers.discard(msg["reader"])
            self._planned.on_reader_gone(reader)

    def _arrive(self, conn: Conn, msg: dict[str, Any], request: int) -> None:
        name = msg["name"] if msg["op"] == "barrier" else f"epoch:{msg['name']}"
        if msg["op"] == "begin_epoch" and msg.get("epoch") is not None:
            self._epoch, self._epoch_set = msg["epoch"], True  # a resume's epoch (as set_epoch)
        self._warn_twins(conn)
        now = time.monotonic()
        try:
            barrier, error = self.barriers.arrive(
                name, msg["parties"], msg["timeout"], Arrival(conn.number, conn.member, request), now
            )
        except CoordinationError as exc:
            conn.send({"id": request, "ok": False, "error": error_body(exc)})
            return
        if error is not None:
            self._answer_barrier(barrier, error=error)
        elif barrier.complete:
            self.barriers.close(barrier)
            epoch = None
            if msg["op"] == "begin_epoch":
                epoch, self._epoch, self._epoch_set = self._epoch, self._epoch + 1, True
                if self._planned is not None:
                    self._planned.on_epoch(epoch)
            self._answer_barrier(barrier, epoch=epoch)
        self._arm_deadline()

    def _warn_twins(self, conn: Conn) -> None:
        """Warn (once per name) when a barrier party's name is live in another process too.

        Checked at barriers, not at hello: names only matter there. A loader's stand-in
        and the worker process that takes over from it share a worker's name for a
        moment, which is harmless (pins are per connection, workers join no barrier).
        """
        if conn.member in self._warned_twins:
            return
        twins = [c.pid for c in self._conns.values()
                 if c is not conn and c.greeted and c.member == conn.member]
        if twins:
            self._warned_twins.add(conn.member)
            log.warning("astream agent: %s (pid %d) waits at a barrier but pid(s) %s joined under that name "
                        "too; barriers cannot tell them apart (check the World of each process)",
                        conn.member, conn.pid, twins)

    def _answer_barrier(self, barrier: Barrier, *, error: CoordinationError | None = None, epoch: int | None = None) -> None:
        answer: dict[str, Any] = {"ok": True, "epoch": epoch} if error is None else {"ok": False, "error": error_body(error)}
        for arrival in barrier.arrivals.values():
            conn = self._conns.get(arrival.conn)
            if conn is not None:
                conn.send({"id": arrival.request, **answer})

    def _arm_deadline(self) -> None:
        if self._deadline is not None:
            self._deadline.cancel()
            self._deadline = None
        when = self.barriers.next_deadline()
        if when is not None:
            self._deadline = asyncio.get_running_loop().call_later(max(0.0, when - time.monotonic()), self._expire)

    def _expire(self) -> None:
        self._deadline = None
        for barrier, error in self.barriers.expire(time.monotonic()):
            self._answer_barrier(barrier, error=error)
        self._arm_deadline()

    def inspect_barrier(self, name: str) -> dict[str, Any]:
        """Who has arrived at barrier ``name`` and who is missing."""
        barrier = self.barriers.open.get(name) or self.barriers.open.get(f"epoch:{name}")
        if barrier is None:
            return {"open": False, "arrived": [], "missing": [], "dead": sorted(self.barriers.dead)}
        return {"open": True, "arrived": sorted(barrier.arrivals), "missing": barrier.missing(),
                "dead": sorted(m for m in self.barriers.dead if m in barrier.missing())}

    def snapshot(self) -> dict[str, Any]:
        """Counters and gauges of the node."""
        return {
            **self.stats,
            "agent_pid": os.getpid(),
            "uptime_s": round(time.monotonic() - self._started, 3),
            "cpu_s": round(time.process_time(), 4),
            "clients": len(self._conns),
            "members": sorted(c.member for c in self._conns.values() if c.greeted),
            "pinned_shards": len(self._pins),
            "pins": sum(self._pins.values()),
            "inflight": sorted(self._inflight),
            "open_barriers": sorted(self.barriers.open),
            "epoch": self._epoch,
            "provider": self.provider.stats(),
        }
