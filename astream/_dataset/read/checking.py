"""The :class:`~astream._dataset.read.ledger.ServedLedger`'s I/O shell for one reader.

One check task per lease whose shard owes something: it waits for the lease, takes what
the ledger holds of the shard and runs :func:`~astream._dataset.read.installed.check_installed`
in a thread. A failed check stops the iteration at its next batch; an iteration settles
every check before it ends.
"""

from __future__ import annotations

import asyncio
import functools
from collections.abc import Callable

from astream._coord.client import AsyncNodeClient
from astream._dataset.read.arriving import ArrivingShards
from astream._dataset.read.installed import check_installed
from astream._dataset.read.ledger import ServedLedger
from astream.errors import ServedSamplesError

__all__ = ["ServedChecks"]


class ServedChecks:
    """The checks of what one reader served before its shards were installed.

    Args:
        node: the reader's node client (a lease passed before it was asked for is asked for
            here, to check against its file).
        arriving: the reader's arriving files (kept open until their shard is checked).
        key: the cache key of a lease's shard.
    """

    def __init__(self, node: AsyncNodeClient, arriving: ArrivingShards | None, key: Callable[[int], str]) -> None:
        self._node = node
        self._arriving = arriving
        self._key = key
        self.ledger = ServedLedger()
        self._tasks: dict[int, asyncio.Task[None]] = {}

    def owe(self, lease: int, shard: int, ready: asyncio.Future[str]) -> None:
        """Check what the ledger holds of ``shard`` once ``lease`` (its future ``ready``) resolves."""
        if lease not in self._tasks:
            task = asyncio.get_running_loop().create_task(self._check(lease, shard, ready))
            self._tasks[lease] = task
            task.add_done_callback(functools.partial(self._done, lease))

    async def _check(self, lease: int, shard: int, future: asyncio.Future[str]) -> None:
        await asyncio.wait([future])  # (not cancelling the lease if this check is cancelled)
        try:
            path = future.result()  # a download that failed for good raises its error here
        except BaseException:
            self._forget(shard)
            raise
        if path:
            await self._verify(lease, shard, path)
            return
        # Passed before this reader asked for it (all of it was served early): the shard is
        # still needed, to check what was served.
        key = self._key(lease)
        try:
            path = await self._node.ensure(key, pin=True)
        except BaseException:
            self._forget(shard)
            raise
        try:
            await self._verify(lease, shard, path)
        finally:
            await self._node.unpin(key)

    async def _verify(self, lease: int, shard: int, path: str) -> None:
        owed = self.ledger.take(shard)
        arriving = self._arriving
        try:
            if owed is not None:
                sources = {} if arriving is None else arriving.sources(shard)
                try:
                    await asyncio.to_thread(check_installed, owed, path, sources)
                except ServedSamplesError as exc:
                    if not isinstance(exc.__cause__, FileNotFoundError):
                        raise
                    # Removed since its install (a temp-folder cleaner): what was served is
                    # checked against the copy the node fetches again (issue 31, item 2).
                    await asyncio.to_thread(check_installed, owed, await self._node.refetch(self._key(lease)),
                                            sources)
        finally:
            if arriving is not None:
                arriving.release(shard)

    def _forget(self, shard: int) -> None:
        self.ledger.forget(shard)
        if self._arriving is not None:
            self._arriving.forget(shard)

    def _done(self, lease: int, task: asyncio.Task[None]) -> None:
        if not task.cancelled() and task.exception() is None:
            # Passed: forgotten, so each batch looks only at the checks still open or failed.
            self._tasks.pop(lease, None)

    def raise_failed(self) -> None:
        """Raise the error of a check that failed (the iteration stops at this batch)."""
        for task in self._tasks.values():
            if task.done() and not task.cancelled() and task.exception() is not None:
                raise task.exception()  # type: ignore[misc]

    async def settle(self) -> None:
        """Before an iteration ends: every sample served early is checked."""
        if self._tasks:
            await asyncio.gather(*self._tasks.values())

    def tasks(self) -> list[asyncio.Task[None]]:
        """The checks still running or failed (cancelled when the reader closes)."""
        return list(self._tasks.values())
