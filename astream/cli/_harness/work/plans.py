"""The epoch plan's workload: one epoch's sample ids for the whole world (``work``), one
worker's (``worker``), one rank's (``rank``) or the shuffle alone, by astream's ``astream.sampling`` or by what
mosaicml-streaming's ``generate_work`` does for ``random`` batching (``resample_streams`` with
every shard drawn once, ``get_partitions``, ``get_shuffle``, two ``np.where`` maps), over
uneven shard sizes; seconds, the peak RSS and a digest of the ids. ``remix``: one worker's ids
of an epoch whose mixture changed twice (astream only)."""

from __future__ import annotations

import hashlib
import time
from typing import Any

from . import stub_streaming_vision

__all__ = ["plan"]


def _remix_worker(sizes: Any, algo: str, ncn: int | None, block: int | None, nodes: int, ranks: int, workers: int, batch: int,
                  epoch: int) -> Any:
    """One worker's ids after the epoch's mixture changed twice (issue 36): the shards split
    into three streams; two at 0.5/0.5, then 0.6/0.2/0.2 (the third added) from a quarter of
    the epoch, then 0.3/0.3/0.4 from half of it; the plan of the rest from half + 10 global
    batches, earlier segments replayed."""
    from astream._sampling.options import PlanOptions
    from astream._sampling.remix import Mixture, mixed_plan
    from astream._sampling.streams import StreamSpec

    third = len(sizes) // 3
    parts = [sizes[:third], sizes[third : 2 * third], sizes[2 * third :]]
    total = int(sizes.sum())

    def mix(weights: tuple[float, ...], start: int) -> Mixture:
        return Mixture(tuple("abc"[: len(weights)]),
                       tuple(StreamSpec(parts[i], proportion=w) for i, w in enumerate(weights)), total, start)

    history = [mix((0.5, 0.5), 0), mix((0.6, 0.2, 0.2), total // 4), mix((0.3, 0.3, 0.4), total // 2)]
    options = PlanOptions(batch_size=batch, shuffle=True, shuffle_algo=algo, num_canonical_nodes=ncn,
                          shuffle_block_size=block, num_physical_nodes=nodes, ranks_per_node=ranks,
                          workers_per_rank=workers, epoch=epoch,
                          sample_in_epoch=total // 2 + 10 * nodes * ranks * batch)
    return mixed_plan(history, options).worker_ids(nodes - 1, ranks - 1, workers - 1)


def _vm(field: str) -> float:
    """A memory line of /proc/self/status in MB (VmHWM: the peak resident set)."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    return 0.0


def plan(lib: str, what: str, samples: int, shards: int, algo: str = "py1e", ncn: int | None = 8,
         block: int | None = 500_000, nodes: int = 8, ranks: int = 8, workers: int = 8, batch: int = 32,
         epoch: int = 0, mem_cap_mb: int | None = None) -> dict[str, Any]:
    """``what``: ``work`` (the world's), ``worker`` (the last worker's), ``rank`` (the last
    rank's, from its own share) or ``shuffle``; ``ncn``/``block`` None for the defaults.
    ``mem_cap_mb`` caps the address space (RLIMIT_AS): a point too big fails alone."""
    if mem_cap_mb:
        import resource

        resource.setrlimit(resource.RLIMIT_AS, (mem_cap_mb << 20, mem_cap_mb << 20))
    import numpy as np

    rng = np.random.default_rng(0)
    weights = rng.uniform(0.5, 1.5, shards)  # uneven shards, about +-50 % around the mean
    sizes = np.diff(np.round(np.cumsum(weights) / weights.sum() * samples).astype(np.int64), prepend=0)
    if lib == "mosaicml":
        stub_streaming_vision()
        from streaming.base.partition import get_partitions
        from streaming.base.shuffle import get_shuffle
    else:
        import astream.sampling as sampling
    base = _vm("VmRSS")
    start, cpu = time.perf_counter(), time.process_time()
    if lib == "mosaicml" and what == "work":
        offsets = np.cumsum(sizes) - sizes
        keep = sizes > 0  # its loop over shards skips empty ones
        units = sizes[keep].astype(np.int64)
        small_per_big = np.concatenate([o + np.arange(s) for s, o in zip(sizes[keep], offsets[keep], strict=True)])
        ncn = ncn or nodes  # MosaicML's default for py1e (and py1b/py1br/naive); py1s/py2s: 64 per node
        block = block or max(4_000_000 // ncn, 1 << 18)
        big = get_partitions("relaxed", int(sizes.sum()), ncn, nodes, ranks, workers, batch, 0, None)
        shuffle = get_shuffle(algo, units, ncn, 9176, epoch, block)
        big = np.where(big != -1, shuffle[big], -1)
        out = np.where(big != -1, small_per_big[big], -1)
    elif what == "shuffle":
        ncn = ncn or nodes
        block = block or max(4_000_000 // ncn, 1 << 18)
        out = (get_shuffle if lib == "mosaicml" else sampling.get_shuffle)(algo, sizes, ncn, 9176, epoch, block)
    elif what == "remix":
        out = _remix_worker(sizes, algo, ncn, block, nodes, ranks, workers, batch, epoch)
    else:
        p = sampling.EpochPlan([{"shard_sizes": sizes}], shuffle=True, shuffle_algo=algo, num_canonical_nodes=ncn,
                               shuffle_block_size=block, batch_size=batch, num_physical_nodes=nodes,
                               ranks_per_node=ranks, workers_per_rank=workers, epoch=epoch)
        if what == "work":
            out = p.work()
        elif what == "rank":
            out = p.rank_ids(nodes - 1, ranks - 1)
        else:
            out = p.worker_ids(nodes - 1, ranks - 1, workers - 1)
    seconds, cpu = time.perf_counter() - start, time.process_time() - cpu
    peak = _vm("VmHWM")
    digest = hashlib.sha1(np.ascontiguousarray(out, "<i8").tobytes()).hexdigest()[:16]
    return {"seconds": seconds, "cpu_seconds": cpu, "peak_rss_mb": peak, "delta_rss_mb": peak - base, "shape": list(out.shape),
            "digest": digest}
