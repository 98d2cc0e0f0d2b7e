"""What a client tells its node agent about its readers (for eviction by next use).

A reader of a bounded cache reports its epoch's shard uses once and its position after
each batch (one-way messages). The client keeps both while the reader is open, so that a
new agent, elected after the old one died, hears them again on joining, as it hears the
client's pins, before anyone asks it to evict.
"""

from __future__ import annotations

from collections.abc import Sequence

from astream._coord.link import Link
from astream._coord.wire import MAX_USES

__all__ = ["PlanReports"]


class PlanReports:
    """The reader reports of :class:`~astream._coord.client.AsyncNodeClient` (mixed in)."""

    _link: Link | None
    _plans: dict[str, tuple[list[int], list[int], list[int], int]]
    _positions: dict[str, int]

    async def _connected(self) -> Link:
        raise NotImplementedError

    async def report_plan(self, reader: str, uses: Sequence[int], starts: Sequence[int], ends: Sequence[int],
                          window: int) -> None:
        """Tell the node a reader's shard uses this epoch (one-way; for eviction by next use).

        Args:
            reader: the reader's name, unique within this client.
            uses: the shard of each run (as the provider encodes it), sorted by start.
            starts, ends: the positions (in the reader's sequence) each run covers.
            window: how far ahead of its position the reader wants shards downloaded.
        """
        self._plans[reader] = (list(uses), list(starts), list(ends), window)
        self._positions[reader] = 0
        self._send_plan(await self._connected(), reader)

    def _send_plan(self, link: Link, reader: str) -> None:
        uses, starts, ends, window = self._plans[reader]
        step = MAX_USES
        for part in range(0, max(1, len(uses)), step):
            link.notify({"op": "plan", "reader": reader, "uses": uses[part : part + step],
                         "starts": starts[part : part + step], "ends": ends[part : part + step],
                         "window": window, "first": part == 0})
        if self._positions.get(reader):
            link.notify({"op": "progress", "reader": reader, "position": self._positions[reader]})

    def report_progress(self, reader: str, position: int) -> None:
        """The reader consumed everything before ``position`` (one-way, no round trip)."""
        if reader in self._positions:
            self._positions[reader] = position
        if self._link is not None and not self._link.lost:
            self._link.notify({"op": "progress", "reader": reader, "position": position})

    def report_done(self, reader: str) -> None:
        """The reader is closed: forget its plan (one-way)."""
        self._plans.pop(reader, None)
        self._positions.pop(reader, None)
        if self._link is not None and not self._link.lost:
            self._link.notify({"op": "reader_done", "reader": reader})
