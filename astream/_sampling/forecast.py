"""What an epoch will cost, from the plan alone: downloads, cache, stall, shuffle quality.

:func:`forecast_epoch` plays each node's readers (ranks x loader workers) through the
cache's own policy simulation (:func:`astream._cache.simulation.simulate`: the same
choice of victims the node agent makes, with the plan's look-ahead) and reads off:

- bytes downloaded, transfers, evictions and re-downloads per node, and the peak cache;
- the smallest workable ``cache_limit`` (:func:`~astream._cache.eviction.min_cache_bytes`);
- with a bandwidth and a step time, the seconds a rank's training loop would wait for
  data (:func:`stall_timeline`);
- a shuffle-quality figure (:func:`shuffle_quality`).

Pure: no I/O and no clock. With ``predownload`` equal to the batch size (no prefetch
beyond the current batch) and one reader per node, the transfers and evictions are
exactly those of a real run (the tests hold it to that).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from astream._cache.eviction import min_cache_bytes
from astream._cache.simulation import SimTrace, simulate
from astream._sampling.order import worker_batches
from astream._sampling.plan import EpochPlan
from astream.errors import CacheError, ConfigError

__all__ = ["EpochForecast", "NodeForecast", "forecast_epoch", "shuffle_quality", "stall_timeline"]


@dataclass(frozen=True)
class NodeForecast:
    """One node's epoch.

    Attributes:
        node: its index.
        readers: ranks x loader workers reading on it.
        steps: lockstep steps (one batch of every reader each).
        downloads: shard transfers (first ones and re-downloads).
        redownloads: transfers of a shard the node had already downloaded this epoch.
        bytes_downloaded: bytes those transfers move over the network (stored sizes).
        evictions: shards deleted to stay under the limit.
        peak_cache_bytes: the most the cache holds at once.
        stall_s: seconds a rank's loop waits for data this epoch (None without a
            bandwidth and step time).
        epoch_s: seconds the epoch takes then (None likewise).
        step_bytes: per step, bytes downloaded in it.
        step_cache_bytes: per step, bytes the cache holds at its end.
    """

    node: int
    readers: int
    steps: int
    downloads: int
    redownloads: int
    bytes_downloaded: int
    evictions: int
    peak_cache_bytes: int
    stall_s: float | None
    epoch_s: float | None
    step_bytes: tuple[int, ...]
    step_cache_bytes: tuple[int, ...]


@dataclass(frozen=True)
class EpochForecast:
    """Every node's epoch, and what holds for all of them.

    Attributes:
        nodes: per node.
        cache_limit: the limit simulated (None: unlimited).
        min_cache_limit: the smallest limit the node's readers can work under.
        dataset_bytes: the footprint of every shard in the cache.
        shuffle_quality: see :func:`shuffle_quality`.
        batch_size: samples per batch (per reader).
        predownload: samples each reader downloads ahead.
    """

    nodes: tuple[NodeForecast, ...]
    cache_limit: int | None
    min_cache_limit: int
    dataset_bytes: int
    shuffle_quality: float
    batch_size: int
    predownload: int

    @property
    def bytes_downloaded(self) -> int:
        return sum(n.bytes_downloaded for n in self.nodes)


def node_orders(plan: EpochPlan, node: int, *, drop_last: bool = False) -> list[np.ndarray]:
    """The shard of each sample each reader of ``node`` reads, in order (ranks, then workers)."""
    out = []
    for rank in range(plan.ranks_per_node):
        for worker in range(plan.workers_per_rank):
            batches = worker_batches(plan, node, rank, worker, drop_last=drop_last)
            ids = batches.ids[: int(batches.bounds[-1])] if batches.num_batches else batches.ids[:0]
            out.append(plan.shard_of(ids))
    return out


def shuffle_quality(plan: EpochPlan, shard_samples: Sequence[int], *, drop_last: bool = False) -> float:
    """How close each batch's shard mix is to a uniform draw: 1.0 as mixed, lower worse.

    The mean number of distinct shards in a batch (every reader's batches of node 0),
    divided by what a batch of as many samples drawn uniformly from the whole dataset
    would span on average (``sum_s 1 - (1 - n_s/N)^b`` for shards of ``n_s`` of ``N``
    samples). A plan that reads one shard at a time scores about ``1 / E``; a perfect
    shuffle about 1.
    """
    counts = np.asarray(shard_samples, np.float64)
    total = float(counts.sum())
    if total <= 0:
        return 0.0
    ratios = []
    for order in node_orders(plan, 0, drop_last=drop_last):
        for a in range(0, len(order), plan.batch_size):
            batch = order[a : a + plan.batch_size]
            expected = float(np.sum(1.0 - (1.0 - counts / total) ** len(batch)))
            ratios.append(len(np.unique(batch)) / expected)
    return float(np.mean(ratios)) if ratios else 0.0


def stall_timeline(trace: SimTrace, transfer_bytes: Sequence[int], *, bandwidth: float, step_time: float,
                   queue_steps: int = 2, latency: float = 0.0) -> tuple[float, float]:
    """Seconds a training loop waits for data over a simulated epoch, and the epoch's length.

    The node's link moves one transfer at a time at ``bandwidth`` bytes/s, each costing
    ``latency`` seconds more (the request's round trip, installing the file), in the order
    the simulation asked for them; a step's transfers start once its reader starts it
    (the readers work up to ``queue_steps`` steps ahead of the loop, as the loader's
    prefetch queue lets them). A step's batches are ready when the last transfer of a
    shard they read has arrived; the loop takes ``step_time`` per step and waits when
    the next one is not ready (the first step's wait included).

    Returns:
        ``(stall_s, epoch_s)``.
    """
    if bandwidth <= 0 or step_time < 0 or latency < 0:
        raise ConfigError(f"bandwidth must be > 0, step_time and latency >= 0, got {bandwidth}, {step_time} "
                          f"and {latency}")
    steps = len(trace.keys)
    link = 0.0
    arrived: dict[int, float] = {}
    ready_prev = 0.0
    got: list[float] = []
    stall = 0.0
    for t in range(steps):
        slot = got[t - queue_steps] if t >= queue_steps else 0.0  # a free place in the queue
        start = max(ready_prev, slot)
        for key in trace.downloads[t]:
            link = max(link, start) + latency + transfer_bytes[key] / bandwidth
            arrived[key] = link
        ready = max([start, *(arrived.get(k, 0.0) for k in trace.keys[t])])
        free = got[-1] + step_time if got else 0.0  # when the loop asks for this step
        got.append(max(free, ready))
        stall += got[-1] - free
        ready_prev = ready
    return stall, (got[-1] + step_time if got else 0.0)


def forecast_epoch(
    plan: EpochPlan, footprints: Sequence[int], transfer_bytes: Sequence[int] | None = None, *,
    shard_samples: Sequence[int] | None = None, cache_limit: int | None = None, predownload: int | None = None,
    bandwidth: float | None = None, step_time: float | None = None, latency: float = 0.0, queue_steps: int = 2,
    drop_last: bool = False,
) -> EpochForecast:
    """Simulate one epoch of every node under ``plan`` and the cache's eviction policy.

    Args:
        plan: the epoch plan (world, batch size, shuffle).
        footprints: bytes each shard takes in the cache (global shard order).
        transfer_bytes: bytes each shard's download moves (default: ``footprints``).
        shard_samples: samples per shard, for :func:`shuffle_quality` (default: from the plan).
        cache_limit: the node's limit in bytes; None for none.
        predownload: samples each reader downloads ahead (default ``8 * batch_size``);
            at most the batch size: no prefetch beyond the current batch.
        bandwidth: the node's download bandwidth in bytes/s, for the stall figure.
        step_time: seconds a training step takes, for the stall figure.
        latency: seconds each transfer costs beyond its bytes (round trip, install).
        queue_steps: batches the loader keeps ready ahead of the loop.
        drop_last: the loader drops each worker's last, incomplete batch.

    Raises:
        CacheError: ``cache_limit`` is below the minimum workable limit.
        ConfigError: a bad bandwidth or step time.
    """
    sizes = [int(s) for s in footprints]
    moved = [int(s) for s in transfer_bytes] if transfer_bytes is not None else sizes
    batch = plan.batch_size
    ahead = predownload if predownload is not None else 8 * batch
    readers = plan.ranks_per_node * plan.workers_per_rank
    least = min_cache_bytes(sizes, batch, readers)
    if shard_samples is None:
        bounds = plan.shard_bounds
        shard_samples = np.diff(bounds).tolist()
    if (bandwidth is None) != (step_time is None):
        raise ConfigError("a stall forecast needs both bandwidth and step_time")
    if cache_limit is not None and cache_limit < least:
        # The dataset refuses such a limit before any download (the same minimum).
        raise CacheError(f"cache_limit={cache_limit} bytes is below the {least} bytes {readers} reader(s) per node "
                         f"need (each holds one batch of {batch} samples, plus one shard for random access)")
    limit = cache_limit if cache_limit is not None else sum(sizes) + least
    nodes = []
    for node in range(plan.num_physical_nodes):
        trace = SimTrace()
        sim = simulate(node_orders(plan, node, drop_last=drop_last), sizes, limit, batch_size=batch,
                       predownload=ahead, trace=trace)
        seen: set[int] = set()
        redownloads = 0
        step_bytes = []
        for keys in trace.downloads:
            redownloads += sum(1 for k in keys if k in seen)
            seen.update(keys)
            step_bytes.append(sum(moved[k] for k in keys))
        stall = epoch = None
        if bandwidth is not None and step_time is not None:
            stall, epoch = stall_timeline(trace, moved, bandwidth=bandwidth, step_time=step_time,
                                          queue_steps=queue_steps, latency=latency)
        nodes.append(NodeForecast(
            node=node, readers=readers, steps=len(trace.keys), downloads=sim.downloads, redownloads=redownloads,
            bytes_downloaded=sum(step_bytes), evictions=sim.evictions, peak_cache_bytes=sim.peak,
            stall_s=stall, epoch_s=epoch, step_bytes=tuple(step_bytes), step_cache_bytes=tuple(trace.held),
        ))
    return EpochForecast(
        nodes=tuple(nodes), cache_limit=cache_limit, min_cache_limit=least, dataset_bytes=sum(sizes),
        shuffle_quality=shuffle_quality(plan, shard_samples, drop_last=drop_last), batch_size=batch,
        predownload=ahead,
    )
