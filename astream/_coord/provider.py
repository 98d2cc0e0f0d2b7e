"""The seam between the node agent and the shard cache: :class:`ShardProvider`.

The agent owns *who* wants a shard (deduplication, waiters, pins, barriers); a provider
owns *how* a shard gets into the node's local cache. The package has one:
:class:`astream._node.provider.CacheProvider`, the shard engine of layer 4 (tests of
this layer use a small whole-file fetcher of their own, ``tests/coord/simple_provider.py``).

A provider lives in the agent's process and event loop. The agent builds it there by
calling a picklable :data:`ProviderFactory`, which every client carries (any client may
have to start a new agent after the old one died).
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any, Protocol, runtime_checkable

__all__ = ["Hurried", "PlanAware", "ProviderFactory", "Rechecked", "ShardProvider", "StageCallback"]

StageCallback = Callable[[str], None]
"""Called by a provider as a shard moves through ``"queue"``, ``"download"``, ``"decompress"``..."""


@runtime_checkable
class PlanAware(Protocol):
    """A provider that also wants the node's readers' plans (to evict by next use)."""

    def on_plan(self, reader: str, uses: list[int], starts: list[int], ends: list[int], window: int) -> None:
        """A reader's shard uses of this epoch (a first part, see ``append_plan``)."""
        ...

    def append_plan(self, reader: str, uses: list[int], starts: list[int], ends: list[int]) -> None:
        """More of a reader's uses (its plan came in several messages)."""
        ...

    def on_progress(self, reader: str, position: int) -> None:
        """The reader consumed everything before ``position``."""
        ...

    def on_reader_gone(self, reader: str) -> None:
        """The reader closed, or its process left the node."""
        ...

    def on_epoch(self, epoch: int) -> None:
        """The node began ``epoch``."""
        ...


@runtime_checkable
class Hurried(Protocol):
    """A provider that can serve some shards before others (a reader's first batch)."""

    def hurry(self, key: str) -> None:
        """A reader's first batch needs ``key``: fetch it before shards needed later.

        Called before the agent starts (or joins) the fetch of ``key``, so the ensure that
        follows already knows."""
        ...


@runtime_checkable
class Rechecked(Protocol):
    """A provider that can look again at a shard a client found gone from the disk."""

    def recheck(self, key: str) -> bool:
        """A client could not open ``key``'s file at the path it was given: if its files are
        not on disk as the index describes them, forget it (the next ensure fetches it
        again) and return True. Never blocks for long (a few ``stat`` calls)."""
        ...


@runtime_checkable
class ShardProvider(Protocol):
    """What the node agent needs from the node's shard cache.

    Keys are shard names relative to the local cache root (``"shard.00003.mds"``, or with a
    stream folder ``"s0/shard.00003.mds.zstd"``); the provider decides where they live.
    The agent guarantees that :meth:`ensure` runs at most once at a time per key.
    """

    async def rebuild(self) -> None:
        """Scan the cache directory and adopt what is there (the disk is the truth).

        Called once when an agent starts, before it serves anyone: remove partial
        downloads a killed agent left behind, index the complete shards.
        """
        ...

    def lookup(self, key: str) -> str | None:
        """The local path of ``key`` if it is complete in the cache now and may be served
        as it is (not waiting for a check), else None. Never blocks.

        Raises:
            ConfigError: ``key`` names no shard of the provider (the agent checks each key
                a client pins this way).
        """
        ...

    async def ensure(self, key: str, stage: StageCallback) -> str:
        """Make ``key`` present and valid in the local cache; return its local path.

        Args:
            key: the shard's name relative to the cache root.
            stage: report each stage (``"queue"``, ``"download"``, ``"decompress"``,
                ``"validate"``) as the shard enters it; the watchdog shows it.

        Raises:
            AstreamError: the shard cannot be made present (download failed, bad hash...);
                the agent forwards it, type and message, to every waiter.
        """
        ...

    def on_pins_changed(self, key: str, pins: int) -> None:
        """Node-wide pin count of ``key`` is now ``pins``; never evict a shard with pins > 0."""
        ...

    def stats(self) -> dict[str, Any]:
        """JSON-able counters (downloads, bytes, evictions...) for the agent's stats."""
        ...

    async def aclose(self) -> None:
        """Release sessions and executors; idempotent."""
        ...


ProviderFactory = Callable[[], ShardProvider]
"""A picklable callable that builds the provider inside the agent process."""
