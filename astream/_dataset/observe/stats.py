"""``Stats``: one public snapshot of what the node and this process did.

``ds.stats()`` / ``loader.stats()`` (and ``await ...astats()`` from async code) ask the
node agent for its cache engines' totals and add this process's own figures; a training
loop can log it every few hundred steps (one round trip to the agent, no lock).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from typing import Any, ClassVar

from astream._dataset.observe.timings import BUCKETS_S, READY_S, STAGES, WaitHistogram
from astream._dataset.quarantine import QuarantineBook

__all__ = ["ConsumerCounters", "Stats"]


@dataclass
class ConsumerCounters:
    """What one consumer (a Loader's iterations) received, and how long it waited."""

    batches: int = 0
    samples: int = 0
    wait_s: float = 0.0
    ready: int = 0  # next() calls answered within READY_S
    elapsed_s: float = 0.0  # from each iteration's first next() to its last batch
    waits: WaitHistogram = field(default_factory=WaitHistogram)

    def received(self, samples: int, waited: float, since_last: float) -> None:
        """One batch handed over after ``waited`` seconds, ``since_last`` after the previous
        one (or the iteration's start)."""
        self.batches += 1
        self.samples += samples
        self.wait_s += waited
        self.elapsed_s += since_last
        if waited <= READY_S:
            self.ready += 1
        self.waits.add(waited)

    def copy(self) -> ConsumerCounters:
        return ConsumerCounters(self.batches, self.samples, self.wait_s, self.ready, self.elapsed_s,
                                self.waits.copy())


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
        requests: shard requests of the node's processes (``hits + misses``).
        redownloads: downloads of a shard the node had downloaded before and evicted.
        epoch_bytes_downloaded: bytes received since the node's current epoch began.
        peak_cache_bytes: the most bytes the cache ever held or reserved.
        download_s: seconds of the node's transfers, summed over transfers (they overlap).
        decode_s: seconds the node spent hashing, decompressing and writing arrived bytes.
        wait_p50_s: median wait of this consumer's ``next()`` (the upper bound of its bucket).
        wait_p99_s: 99th percentile of that wait.
        wait_max_s: the longest wait.
        readiness: share of this consumer's ``next()`` answered at once (within 1 ms): the
            batch was waiting for it (1.0: never waited; 0 before any batch).
        stall: share of this consumer's iteration time spent waiting in ``next()``.
        wait_buckets: ``(upper bound in seconds, count)`` of the waits, empty buckets left
            out (the last bound is ``inf``).
        stages: this process's seconds and calls per stage (``read``, ``collate``,
            ``transform``, ``transport`` from worker processes, whose own stage times arrive
            with the end of each of their epochs), plus the node's ``download`` and ``decode``.
        bad_samples: ``on_bad_sample="skip"``: bad samples this loader replaced by a stand-in,
            all epochs (one per position: a sample met in two epochs counts twice).
        quarantined: the distinct bad samples met, as ``(sample, shard file, reason, cause)``
            (``reason``: ``decode``, ``hash``, ``transform``, or ``state`` when only a loaded
            state named it).
        node: everything else the agent reports (clients, pins, epoch, uptime...).
        mixture: the change of mixture this epoch resumed under (``on_mixture_change``), empty
            when it never changed: ``epoch``, ``changes`` (the sample of each change),
            ``samples`` (what the rest of the epoch holds from the last change) and, per
            stream of the mixture in force, ``stream``, ``unseen``, ``wanted`` and ``given``.
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
    requests: int = 0
    redownloads: int = 0
    epoch_bytes_downloaded: int = 0
    peak_cache_bytes: int = 0
    download_s: float = 0.0
    decode_s: float = 0.0
    wait_p50_s: float = 0.0
    wait_p99_s: float = 0.0
    wait_max_s: float = 0.0
    readiness: float = 0.0
    stall: float = 0.0
    wait_buckets: tuple[tuple[float, int], ...] = ()
    stages: dict[str, dict[str, float]] = field(default_factory=dict)
    node: dict[str, Any] = field(default_factory=dict)
    mixture: dict[str, Any] = field(default_factory=dict)
    bad_samples: int = 0
    quarantined: tuple[tuple[int, str, str, str], ...] = ()

    # Not the engines' figures: the consumer's, or computed here.
    _CONSUMER: ClassVar[tuple[str, ...]] = (
        "batches", "samples", "consumer_wait_s", "wait_p50_s", "wait_p99_s", "wait_max_s", "readiness", "stall",
        "wait_buckets", "stages", "requests", "mixture", "bad_samples", "quarantined",
    )

    @classmethod
    def of(cls, agent: dict[str, Any], consumer: ConsumerCounters | None = None,
           mixture: dict[str, Any] | None = None, book: QuarantineBook | None = None) -> Stats:
        """From the agent's ``stats`` answer, a consumer's counters, its mixture and its bad samples."""
        cache = dict(agent.get("provider") or {})
        # Requests are counted where they arrive, by the agent; a request it answers itself
        # never reaches an engine, so the engines' own hit counts would miss those.
        for name in ("hits", "misses"):
            cache.pop(name, None)
        known = {f for f in cls.__dataclass_fields__ if f != "node" and f not in cls._CONSUMER}
        figures = {name: cache.pop(name) for name in list(cache) if name in known}
        figures["hits"] = int(agent.get("hits", 0)) + int(agent.get("coalesced", 0))
        figures["misses"] = int(agent.get("fetches", 0))
        wait = cache.pop("consumer_wait_s", 0.0)
        node = {k: v for k, v in agent.items() if k != "provider"}
        node["cache"] = cache  # figures a newer cache engine reports that this class does not name
        c = consumer or ConsumerCounters()
        stages = STAGES.snapshot()
        stages["download"] = {"seconds": float(figures.get("download_s", 0.0)),
                              "calls": int(figures.get("shards_downloaded", 0))}
        stages["decode"] = {"seconds": float(figures.get("decode_s", 0.0)),
                            "calls": int(figures.get("shards_downloaded", 0))}
        bounds = (*BUCKETS_S, float("inf"))
        return cls(**figures, shard_wait_s=float(wait), batches=c.batches, samples=c.samples,
                   consumer_wait_s=c.wait_s, requests=figures["hits"] + figures["misses"],
                   wait_p50_s=c.waits.quantile(0.5), wait_p99_s=c.waits.quantile(0.99), wait_max_s=c.waits.max_s,
                   readiness=c.ready / c.batches if c.batches else 0.0,
                   stall=min(1.0, c.wait_s / c.elapsed_s) if c.elapsed_s > 0 else 0.0,
                   wait_buckets=tuple((b, n) for b, n in zip(bounds, c.waits.counts, strict=True) if n),
                   stages=stages, node=node, mixture=dict(mixture or {}),
                   bad_samples=0 if book is None else book.total,
                   quarantined=() if book is None else tuple(r.as_tuple() for r in book.known.values()))

    @property
    def hit_rate(self) -> float:
        """Shard requests served without a new transfer, out of all (0 before any)."""
        total = self.hits + self.misses
        return self.hits / total if total else 0.0

    def as_dict(self) -> dict[str, Any]:
        """A plain dict (for logs and metrics)."""
        return asdict(self)
