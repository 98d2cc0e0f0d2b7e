"""One connection from a client to its node agent, as an :class:`asyncio.Protocol`.

Requests are multiplexed by id; answers resolve their futures; a closed connection fails
every pending request with :class:`AgentLost` and tells the client, which rejoins.
"""

from __future__ import annotations

import asyncio
import itertools
from collections.abc import Callable
from typing import Any, cast

from astream import errors
from astream._coord.wire import FrameDecoder, encode, validate_reply
from astream.errors import AgentLost, CoordinationError

__all__ = ["AgentLost", "Link"]


def _error(body: dict[str, Any]) -> errors.AstreamError:
    cls = getattr(errors, str(body.get("type")), None)
    if not (isinstance(cls, type) and issubclass(cls, errors.AstreamError)) or cls is errors.MissingExtraError:
        cls = CoordinationError
    return cls(body.get("message", "the node agent failed"))


class Link(asyncio.Protocol):
    """One connection to the agent, multiplexing requests by id.

    Args:
        max_frame: the largest frame accepted from the agent.
        on_lost: called when the connection closes other than by :meth:`close`.
    """

    def __init__(self, max_frame: int, on_lost: Callable[[], None] | None = None) -> None:
        self.pending: dict[int, asyncio.Future[dict[str, Any]]] = {}
        self.on_lost = on_lost
        self.closing = False
        self.transport: asyncio.Transport | None = None
        self.lost = False
        self._outbox: list[bytes] = []
        self._ids = itertools.count(1)
        self._decoder = FrameDecoder(max_frame)

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        self.transport = cast(asyncio.Transport, transport)  # uvloop's are not subclasses

    def data_received(self, data: bytes) -> None:
        try:
            for message in self._decoder.feed(data):
                validate_reply(message)
                future = self.pending.pop(message["id"], None)
                if future is None or future.done():
                    continue
                if message["ok"]:
                    future.set_result(message)
                else:
                    future.set_exception(_error(message["error"]))
        except CoordinationError as exc:  # a version mismatch, or garbage from the agent
            self._fail_all(exc)
            if self.transport is not None:
                self.transport.close()

    def connection_lost(self, exc: Exception | None) -> None:
        self._fail_all(AgentLost(f"the node agent closed the connection ({exc or 'EOF'})"))
        if not self.closing and self.on_lost is not None:
            self.on_lost()

    def _fail_all(self, exc: CoordinationError) -> None:
        self.lost = True
        pending, self.pending = self.pending, {}
        for future in pending.values():
            if not future.done():
                future.set_exception(exc)

    def request(self, message: dict[str, Any]) -> asyncio.Future[dict[str, Any]]:
        future: asyncio.Future[dict[str, Any]] = asyncio.get_running_loop().create_future()
        if self.lost or self.transport is None:
            future.set_exception(AgentLost("the connection to the node agent is closed"))
            return future
        request = next(self._ids)
        message["id"] = request
        self.pending[request] = future
        self._outbox.append(encode(message))
        self._flush()
        return future

    def notify(self, message: dict[str, Any]) -> None:
        """Queue a one-way message; it leaves with the next request or on the next loop turn.

        Unpin-then-ensure, a loader's step from one shard to the next, is one write and
        one wake-up of the agent instead of two.
        """
        if self.lost or self.transport is None:
            return
        self._outbox.append(encode(message))
        if len(self._outbox) == 1:
            asyncio.get_running_loop().call_soon(self._flush)

    def _flush(self) -> None:
        if self._outbox and self.transport is not None and not self.lost:
            self.transport.write(b"".join(self._outbox))
        self._outbox.clear()

    def close(self) -> None:
        self.closing = True
        if self.transport is not None:
            self._flush()
            self.transport.close()
