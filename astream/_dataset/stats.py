"""``Stats``: one public snapshot of what the node and this process did.

``ds.stats()`` / ``loader.stats()`` (and ``await ...astats()`` from async code) ask the
node agent for its cache engines' totals and add this process's own figures; a training
loop can log it every few hundred steps (one round trip to the agent, no lock).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any

__all__ = ["ConsumerCounters", "Stats"]


@dataclass
class ConsumerCounters:
    """What one consumer (a Loader's iterations) received, and how long it waited."""

    batches: int = 0
    samples: int = 0
    wait_s: float = 0.0


@dataclass(frozen=True)
class Stats:
    """The node's cache figures (all processes of the node) and this consumer's.

    Attributes:
        bytes_downloaded: bytes the node received from the remote (or read from a local one).
        shards_downloaded: shards the node fetched and installed.
        hits: shard requests of the node's processes served from the cache, or joined to a
            transfer already in flight (the agent's count).
        misses: shard requests that started a transfer.
        evictions: shards removed to stay under ``cache_limit``.
        retries: transfer attempts retried, any cause.
        throttled: retries caused by the remote shedding load (429, 503, SlowDown).
        hash_failures: shards that failed ``validate_hash`` and were fetched again.
        concurrency: the node's current transfer limit (throttling lowers it).
        in_flight: transfers running now.
        cache_bytes: bytes the cache holds or has reserved.
        shard_wait_s: seconds readers of the node waited for shards to be ready.
        batches: batches this loader handed to its consumer (0 for ``ds.stats()``).
        samples: samples in those batches.
        consumer_wait_s: seconds the consumer spent waiting in ``next()`` / ``__anext__``.
        node: everything else the agent reports (clients, pins, epoch, uptime...).
    """

    bytes_downloaded: int = 0
    shards_downloaded: int = 0
    hits: int = 0
    misses: int = 0
    evictions: int = 0
    retries: int = 0
    throttled: int = 0
    hash_failures: int = 0
    concurrency: int = 0
    in_flight: int = 0
    cache_bytes: int = 0
    shard_wait_s: float = 0.0
    batches: int = 0
    samples: int = 0
    consumer_wait_s: float = 0.0
    node: dict[str, Any] = field(default_factory=dict)

    @classmethod
    def of(cls, agent: dict[str, Any], consumer: ConsumerCounters | None = None) -> Stats:
        """From the agent's ``stats`` answer and a consumer's counters."""
        cache = dict(agent.get("provider") or {})
        # Requests are counted where they arrive, by the agent; a request it answers itself
        # never reaches an engine, so the engines' own hit counts would miss those.
        for name in ("hits", "misses"):
            cache.pop(name, None)
        known = {f for f in cls.__dataclass_fields__ if f not in ("node", "batches", "samples", "consumer_wait_s")}
        figures = {name: cache.pop(name) for name in list(cache) if name in known}
        figures["hits"] = int(agent.get("hits", 0)) + int(agent.get("coalesced", 0))
        figures["misses"] = int(agent.get("fetches", 0))
        wait = cache.pop("consumer_wait_s", 0.0)
        node = {k: v for k, v in agent.items() if k != "provider"}
        node["cache"] = cache  # figures a newer cache engine reports that this class does not name
        c = consumer or ConsumerCounters()
        return cls(**figures, shard_wait_s=float(wait), batches=c.batches, samples=c.samples,
                   consumer_wait_s=c.wait_s, node=node)

    @property
    def hit_rate(self) -> float:
        """Shard requests served without a new transfer, out of all (0 before any)."""
        total = self.hits + self.misses
        return self.hits / total if total else 0.0

    def as_dict(self) -> dict[str, Any]:
        """A plain dict (for logs and metrics)."""
        return asdict(self)
