"""One client connection of the node agent, and one request waiting for shards.

:class:`Conn` is the :class:`asyncio.Protocol` of a connection: bytes go through the
sans-I/O :class:`~astream._coord.wire.FrameDecoder`, each request to the agent's
``dispatch``; a malformed frame closes that connection only. :class:`Wait` collects the
paths of one ``ensure``/``ensure_many`` request and answers it once.
"""

from __future__ import annotations

import asyncio
import logging
import os
import socket
from typing import TYPE_CHECKING, Any, cast

from astream._coord.rendezvous import peer_credentials
from astream._coord.wire import FrameDecoder, ProtocolError, VersionMismatch, encode, validate_request
from astream.errors import AstreamError

if TYPE_CHECKING:
    from astream._coord.agent import Agent

__all__ = ["Conn", "Wait", "error_body", "socket_file"]

log = logging.getLogger("astream.coord")


def error_body(exc: BaseException) -> dict[str, str]:
    """How an exception travels in an answer."""
    kind = type(exc).__name__ if isinstance(exc, AstreamError) else "CoordinationError"
    return {"type": kind, "message": str(exc) if isinstance(exc, AstreamError) else f"{type(exc).__name__}: {exc}"}


def socket_file(listener: socket.socket) -> tuple[str, int] | None:
    name = listener.getsockname()
    if isinstance(name, str) and name and not name.startswith("\0"):
        return name, os.stat(name).st_ino
    return None


class Conn(asyncio.Protocol):
    """One client connection."""

    def __init__(self, agent: Agent, number: int) -> None:
        self.agent = agent
        self.number = number
        self.member = f"conn{number}"
        self.pid = 0
        self.greeted = False
        self.clean = False
        self.closed = False
        self.pins: set[str] = set()  # a client pins a key once; it counts its own holds
        self.readers: set[str] = set()  # plan-reporting readers of this connection
        self.transport: asyncio.Transport | None = None
        self._decoder = FrameDecoder(agent.config.max_frame)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's are not subclasses
        sock = self.transport.get_extra_info("socket")
        creds = peer_credentials(sock) if sock is not None else None
        if creds is not None and creds[1] != self.agent.allowed_uid:
            log.warning("astream agent: refused pid %d of uid %d (another user)", creds[0], creds[1])
            self.closed = True
            self.transport.abort()
            return
        self.agent.connected(self)

    def data_received(self, data: bytes) -> None:
        if self.closed:
            return
        try:
            for message in self._decoder.feed(data):
                self._handle(validate_request(message))
        except VersionMismatch as exc:
            log.warning("astream agent: %s: %s", self.member, exc)
            self.send({"id": 0, "ok": False, "error": error_body(exc)})
            self.close()
        except ProtocolError as exc:
            log.warning("astream agent: closing %s (pid %d): %s", self.member, self.pid, exc)
            self.agent.stats["protocol_errors"] += 1
            self.close()

    def _handle(self, message: dict[str, Any]) -> None:
        try:
            self.agent.dispatch(self, message)
        except ProtocolError:
            raise
        except Exception as exc:  # a bug must cost one answer, not the node
            log.exception("astream agent: %s failed on %s", self.member, message.get("op"))
            if message.get("id") is not None:
                self.send({"id": message["id"], "ok": False, "error": error_body(exc)})

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self.agent.disconnected(self)

    def send(self, message: dict[str, Any]) -> None:
        if not self.closed and self.transport is not None:
            self.transport.write(encode(message))

    def close(self) -> None:
        if self.transport is not None and not self.transport.is_closing():
            self.transport.close()


class Wait:
    """One ``ensure``/``ensure_many`` request waiting for its shards."""

    __slots__ = ("conn", "done", "index", "paths", "remaining", "request", "single")

    def __init__(self, conn: Conn, request: int, keys: list[str], single: bool) -> None:
        self.conn, self.request, self.single, self.done = conn, request, single, False
        self.paths: list[str | None] = [None] * len(keys)
        self.index: dict[str, list[int]] = {}
        for i, key in enumerate(keys):
            self.index.setdefault(key, []).append(i)
        self.remaining = len(self.index)

    def deliver(self, key: str, path: str | None, error: BaseException | None) -> None:
        """One shard is ready (or failed); answer once all are, or at the first failure."""
        if self.done or key not in self.index:
            return
        if error is not None:
            self.done = True
            self.conn.send({"id": self.request, "ok": False, "error": error_body(error)})
            return
        for i in self.index.pop(key):
            self.paths[i] = path
        self.remaining -= 1
        if self.remaining == 0:
            self.done = True
            answer = {"path": self.paths[0]} if self.single else {"paths": self.paths}
            self.conn.send({"id": self.request, "ok": True, **answer})
