"""Counters of one shard engine, cheap to read at any time.

:class:`CacheStats` is mutated in place by the engine (on its loop); reading an
attribute or taking a :meth:`~CacheStats.snapshot` costs no lock and no I/O.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

__all__ = ["CacheStats"]


@dataclass
class CacheStats:
    """What the engine did so far.

    Attributes:
        bytes_downloaded: bytes received over the network (or read from a local remote).
        shards_downloaded: shards fetched and installed in the cache.
        hits: requests served without a new transfer (shard in the cache, or already coming).
        misses: requests that needed a transfer.
        evictions: shards removed to stay under ``cache_limit``.
        redownloads: downloads of a shard this engine had downloaded before (and evicted).
        epoch_bytes_downloaded: bytes received since the node's current epoch began.
        cancelled: transfers cancelled on the way (their last pin went: a reader moved
            on, or the node dropped a prefetch to make room for a reader's request).
        prefetches: downloads started ahead of any reader asking (the node's plan said so).
        peak_cache_bytes: the most ``cache_bytes`` ever held or reserved.
        retries: transfer attempts retried (any cause).
        throttled: retries caused by the remote shedding load (429, 503, SlowDown).
        hash_failures: shards that failed ``validate_hash`` (and were fetched again).
        vanished: ready shards whose files were found gone from the disk (removed by
            someone else) and were forgotten, to be fetched again.
        consumer_wait_s: seconds a consumer spent waiting for a shard to be ready.
        download_s: seconds transfers took, summed over transfers (they overlap).
        decode_s: seconds spent hashing, decompressing and writing the bytes that arrived.
        concurrency: the current transfer limit (lowered by throttling, raised by successes).
        in_flight: transfers running now.
        cache_bytes: bytes the cache holds or has reserved for transfers in flight.
    """

    bytes_downloaded: int = 0
    shards_downloaded: int = 0
    hits: int = 0
    misses: int = 0
    evictions: int = 0
    redownloads: int = 0
    epoch_bytes_downloaded: int = 0
    prefetches: int = 0
    cancelled: int = 0
    peak_cache_bytes: int = 0
    retries: int = 0
    throttled: int = 0
    hash_failures: int = 0
    vanished: int = 0
    consumer_wait_s: float = 0.0
    download_s: float = 0.0
    decode_s: float = 0.0
    concurrency: int = 0
    in_flight: int = 0
    cache_bytes: int = 0
    _extra: dict[str, float] = field(default_factory=dict, repr=False)

    def snapshot(self) -> dict[str, float]:
        """The counters as a plain dict (for logs and metrics)."""
        out = asdict(self)
        out.pop("_extra")
        return out
