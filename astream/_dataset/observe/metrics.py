"""The metrics the exporters publish, read off :class:`~astream._dataset.observe.stats.Stats`.

One table (:data:`METRICS`) names every metric, its kind, unit and where its value comes
from; the OpenTelemetry and Prometheus exporters (``otel.py``, ``prometheus.py``) only
translate it. Nothing here runs until an exporter is enabled: a ``Loader`` costs one
weak reference in :data:`LOADERS` when it is made.

Each live loader is one :class:`Source` (this module never imports the ``Loader``), labelled ``loader`` (its number in this process),
``rank`` and ``node``. A loader's figures include its worker processes' (their stage
times reach the consumer's process); the ``astream_node_*`` figures are the node
agent's, the same for every rank of a node.
"""

from __future__ import annotations

import itertools
import logging
import weakref
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any, Protocol

from astream._dataset.observe.stats import Stats
from astream._dataset.observe.timings import STAGE_NAMES

__all__ = ["LOADERS", "METRICS", "Metric", "Source", "register", "snapshots"]

log = logging.getLogger("astream")



class Source(Protocol):
    """What the exporters read of a loader."""

    def _metric_place(self) -> tuple[int, int]:
        """Its process's rank and node (the ``rank`` and ``node`` labels)."""
        ...

    async def astats(self) -> Stats:
        """Its figures and its node's."""
        ...

    def _own_stats(self) -> Stats:
        """Its own figures, without the node's (when the node cannot be asked)."""
        ...


# Live loaders, and the number each got (its ``loader`` label).
LOADERS: weakref.WeakKeyDictionary[Source, int] = weakref.WeakKeyDictionary()
_numbers = itertools.count()
# Seconds an exporter waits for the node agent's figures before exporting without them.
STATS_TIMEOUT = 5.0
# The stages a per-stage metric is labelled with: this process's, then the node agent's.
METRIC_STAGES = (*STAGE_NAMES, "download", "decode")


def register(loader: Source) -> None:
    """A new loader: one more source (called by ``Loader.__init__``)."""
    LOADERS[loader] = next(_numbers)


@dataclass(frozen=True)
class Metric:
    """One exported metric.

    Attributes:
        name: without a unit suffix or ``_total`` (the exporters add what their convention wants).
        kind: ``"counter"`` (only grows), ``"gauge"``, or ``"histogram"`` (the next() waits).
        unit: ``"s"``, ``"By"`` or ``"1"``, as OpenTelemetry spells them.
        description: what it counts.
        read: its value in a snapshot (for ``per_stage`` metrics: a dict by stage).
        per_stage: labelled by ``stage`` as well.
    """

    name: str
    kind: str
    unit: str
    description: str
    read: Callable[[Stats], Any]
    per_stage: bool = False


def _stage(field: str) -> Callable[[Stats], dict[str, float]]:
    return lambda s: {k: float(s.stages.get(k, {}).get(field, 0.0)) for k in METRIC_STAGES}


METRICS: tuple[Metric, ...] = (
    Metric("astream_batches", "counter", "1", "batches the loader handed to its consumer", lambda s: s.batches),
    Metric("astream_samples", "counter", "1", "samples in those batches", lambda s: s.samples),
    Metric("astream_next_wait", "histogram", "s", "time each next() of the consumer waited for a batch",
           lambda s: s.wait_buckets),
    Metric("astream_next_wait_p50", "gauge", "s", "median next() wait (upper bound of its bucket)",
           lambda s: s.wait_p50_s),
    Metric("astream_next_wait_p99", "gauge", "s", "99th percentile next() wait", lambda s: s.wait_p99_s),
    Metric("astream_readiness", "gauge", "1", "share of next() calls answered at once (within 1 ms)",
           lambda s: s.readiness),
    Metric("astream_stall", "gauge", "1", "share of the consumer's iteration time spent waiting in next()",
           lambda s: s.stall),
    Metric("astream_bad_samples", "counter", "1", "bad samples replaced by a stand-in (on_bad_sample='skip')",
           lambda s: s.bad_samples),
    Metric("astream_stage", "counter", "s", "seconds spent per pipeline stage", _stage("seconds"), per_stage=True),
    Metric("astream_stage_calls", "counter", "1", "calls (batches, or shards for download/decode) per stage",
           _stage("calls"), per_stage=True),
    Metric("astream_node_downloaded", "counter", "By", "bytes the node received from the remote",
           lambda s: s.bytes_downloaded),
    Metric("astream_node_shards_downloaded", "counter", "1", "shard transfers of the node",
           lambda s: s.shards_downloaded),
    Metric("astream_node_requests", "counter", "1", "shard requests of the node's processes", lambda s: s.requests),
    Metric("astream_node_hits", "counter", "1", "shard requests served without a new transfer", lambda s: s.hits),
    Metric("astream_node_retries", "counter", "1", "transfer attempts retried", lambda s: s.retries),
    Metric("astream_node_throttled", "counter", "1", "retries because the remote shed load (429, 503, SlowDown)",
           lambda s: s.throttled),
    Metric("astream_node_evictions", "counter", "1", "shards evicted to stay under cache_limit", lambda s: s.evictions),
    Metric("astream_node_redownloads", "counter", "1", "transfers of a shard downloaded before and evicted",
           lambda s: s.redownloads),
    Metric("astream_node_hash_failures", "counter", "1", "shards that failed validate_hash", lambda s: s.hash_failures),
    Metric("astream_node_shard_wait", "counter", "s", "seconds the node's readers waited for shards",
           lambda s: s.shard_wait_s),
    Metric("astream_node_cache_bytes", "gauge", "By", "bytes the cache holds or has reserved", lambda s: s.cache_bytes),
    Metric("astream_node_peak_cache_bytes", "gauge", "By", "the most bytes the cache ever held",
           lambda s: s.peak_cache_bytes),
    Metric("astream_node_transfers_in_flight", "gauge", "1", "transfers running now", lambda s: s.in_flight),
    Metric("astream_node_transfer_limit", "gauge", "1", "the node's transfer concurrency (throttling lowers it)",
           lambda s: s.concurrency),
)


def labels_of(loader: Source, number: int) -> dict[str, str]:
    rank, node = loader._metric_place()
    return {"loader": str(number), "rank": str(rank), "node": str(node)}


def snapshots() -> list[tuple[dict[str, str], Stats]]:
    """Every live loader's labels and :class:`Stats` now.

    A loader whose node cannot be asked (its dataset closed, the agent gone) still gives
    its own figures, without the node's.
    """
    out = []
    # a copy first: a loader collected meanwhile must not change the dict under the loop
    for loader, number in sorted(list(LOADERS.items()), key=lambda item: item[1]):  # noqa: C414
        stats = _stats_of(loader)
        out.append((labels_of(loader, number), stats))
    return out


def _stats_of(loader: Source) -> Stats:
    from astream._dataset.runtime import portal

    try:
        return portal().call(loader.astats(), timeout=STATS_TIMEOUT)
    except Exception as exc:  # a metrics scrape must never take the training loop down
        log.debug("astream: node figures of a loader unavailable for metrics: %s", exc)
        return loader._own_stats()
