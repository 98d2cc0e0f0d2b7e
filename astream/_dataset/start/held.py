"""A node client whose join can wait: the iteration's, while its reader's batch 0 is read.

Where the start-up prelude has a loaded position's batch 0 decoded
(:mod:`astream._dataset.start.prelude`), the iteration's reader reads it before the node is
joined; its lease requests, made as the reader starts, would join at once and start the
node agent beside that read (on two cores the agent's start took the interpreter lock from
the first batch, as from the decode: tuning.py's ``hold_s``). The loop's client is therefore
held until batch 0 is handed out (:meth:`HeldClient.hold_until`), ``hold_s`` at most (a hint:
a read that needed the node after all goes on then); every call it gets meanwhile waits at
the client's one seam, :meth:`~astream._coord.joining.Joining._connected`, and none is lost.
"""

from __future__ import annotations

import asyncio
import contextlib
from concurrent.futures import Future

from astream._coord.client import AsyncNodeClient
from astream._coord.link import Link
from astream._dataset import tuning
from astream._storage.loop import within

__all__ = ["HeldClient"]


class HeldClient(AsyncNodeClient):
    """An :class:`~astream._coord.client.AsyncNodeClient` whose calls can be held (see the module)."""

    _until: Future[None] | None = None

    def hold_until(self, until: Future[None]) -> None:
        """Hold every call (and with it the join) until ``until`` is done (``hold_s`` at most)."""
        self._until = until

    async def _connected(self) -> Link:
        until = self._until
        if until is not None:
            if not until.done():
                with contextlib.suppress(TimeoutError, asyncio.TimeoutError):  # (a hint: never waited for long)
                    await within(tuning.READ_AHEAD.hold_s, asyncio.shield(asyncio.wrap_future(until)))
            if self._until is until:
                self._until = None
        return await super()._connected()
