"""``astream bench``: stream a dataset with a given loader config and report how fast it went.

Reports samples/s, MB/s (of sample data, and of bytes downloaded), the time to the
first batch, the node cache's hit rate and peak memory. The hit rate is what the node
agent counts (``AsyncNodeClient.stats()``): shard requests answered from the cache,
out of all shard requests (answered, fetched, or joined to a fetch in flight). Without
``--local`` the cache is a fresh temporary folder (a cold run) removed afterwards, also
for a local dataset, which is then read through the cache like any remote.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import sys
import tempfile
import time
from typing import Any

from astream._dataset.dataset import StreamingDataset
from astream._dataset.handed import batch_length
from astream._dataset.loader import Loader
from astream._dataset.runtime import portal
from astream.cli._output import CommandError, format_size, progress
from astream.cli._source import is_local

__all__ = ["add_parser", "run"]


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    """Declare ``astream bench``."""
    p = sub.add_parser("bench", parents=[common], help="stream a dataset and report throughput and cache stats; "
                       "'bench compare': against the installed peers",
                       description="Stream a dataset through a Loader and report samples/s, MB/s, time to "
                                   "first batch, cache hit rate and peak memory. 'astream bench compare' "
                                   "compares astream with the installed peers (see its --help).")
    p.add_argument("url", metavar="URL", help="the remote (http(s)://, s3://, file://) or a local dataset folder")
    p.add_argument("--local", help="the cache folder (default: a fresh temporary one, i.e. a cold cache)")
    p.add_argument("--split", help="sub-folder of the dataset")
    p.add_argument("--batch-size", type=int, default=32, help="samples per batch (default: 32)")
    p.add_argument("--workers", type=int, default=0, help="loader workers (default: 0, read in this process)")
    p.add_argument("--worker-mode", choices=("process", "thread"), default="process", help="(default: process)")
    p.add_argument("--shuffle", action="store_true", help="shuffle (py1e, MosaicML's default)")
    p.add_argument("--seed", type=int, default=9176, help="shuffle seed (default: 9176)")
    p.add_argument("--limit", type=int, help="stop after this many samples (default: one epoch)")
    p.add_argument("--cache-limit", help="cache size limit, e.g. 1gb")
    p.add_argument("--validate-hash", metavar="ALGO", help="check every downloaded shard with this hash")
    p.add_argument("--step-time", type=float, default=None, metavar="SECONDS",
                   help="simulate an accelerator: sleep this long per batch and report its utilisation")
    p.add_argument("--json", action="store_true", help="print the results as JSON")
    p.set_defaults(func=run)


async def _node_stats(ds: StreamingDataset) -> dict[str, Any]:
    node = await ds.node()
    return await node.stats()


def _peak_rss() -> int:
    # ru_maxrss is KiB on Linux, bytes on macOS. Worker processes are children of the
    # forkserver, not of this process, so RUSAGE_CHILDREN would not see them either.
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * (1 if sys.platform == "darwin" else 1024)


def _stream(args: argparse.Namespace, remote: str | None, local: str) -> dict[str, Any]:
    quiet = bool(getattr(args, "quiet", False))
    start = time.perf_counter()
    ds = StreamingDataset(remote=remote, local=local, split=args.split, batch_size=args.batch_size,
                          shuffle=args.shuffle, shuffle_seed=args.seed, cache_limit=args.cache_limit,
                          validate_hash=args.validate_hash)
    try:
        index_s = time.perf_counter() - start
        loader = Loader(ds, num_workers=args.workers, worker_mode=args.worker_mode)
        epoch = len(ds)
        target = epoch if args.limit is None else min(args.limit, epoch)
        samples = batches = 0
        first_batch_s = None
        compute = 0.0
        start = time.perf_counter()
        batches_iter = iter(loader)
        try:
            with progress(quiet, total=target, unit="samples", unit_scale=True, desc="bench") as bar:
                for batch in batches_iter:
                    if first_batch_s is None:
                        first_batch_s = time.perf_counter() - start
                    n = batch_length(batch)
                    samples += n
                    batches += 1
                    bar.update(n)
                    if samples >= target:
                        break
                    if args.step_time:
                        began = time.perf_counter()
                        time.sleep(args.step_time)  # the accelerator's step
                        compute += time.perf_counter() - began
        finally:
            batches_iter.close()  # type: ignore[attr-defined]
        elapsed = time.perf_counter() - start
        stats = portal().call(_node_stats(ds))
        consumer = loader.stats()
        raw_per_sample = sum(sh.raw_data.bytes for i in ds.indexes for sh in i.shards) / max(1, ds.size)
    finally:
        ds.close()
    provider = stats.get("provider", {})
    hits, fetches, joined = (int(stats.get(k, 0)) for k in ("hits", "fetches", "coalesced"))
    requests = hits + fetches + joined
    downloaded = int(provider.get("bytes_downloaded", 0))
    return {
        "url": args.url, "local": local, "batch_size": args.batch_size, "workers": args.workers,
        "shuffle": args.shuffle, "samples": samples, "batches": batches, "seconds": round(elapsed, 4),
        "samples_per_s": round(samples / elapsed, 1) if elapsed else None,
        "data_mb_per_s": round(samples * raw_per_sample / elapsed / 1e6, 2) if elapsed else None,
        "download_mb_per_s": round(downloaded / elapsed / 1e6, 2) if elapsed else None,
        "index_s": round(index_s, 4),
        "first_batch_s": None if first_batch_s is None else round(first_batch_s, 4),
        "shard_requests": requests, "cache_hits": hits, "shards_fetched": fetches, "joined_in_flight": joined,
        "cache_hit_rate": round(hits / requests, 4) if requests else None,
        "bytes_downloaded": downloaded, "shards_downloaded": int(provider.get("shards_downloaded", 0)),
        "retries": int(provider.get("retries", 0)),
        "peak_rss_bytes": _peak_rss(),
        "wait_p50_s": consumer.wait_p50_s, "wait_p99_s": consumer.wait_p99_s, "readiness": round(consumer.readiness, 4),
        "stall": round(consumer.stall, 4), "step_time_s": args.step_time,
        # From the first batch on (the first batch's wait is reported above).
        "accelerator_utilisation": (round(compute / (elapsed - first_batch_s), 4)
                                    if args.step_time and first_batch_s is not None and elapsed > first_batch_s
                                    else None),
    }


def run(args: argparse.Namespace) -> int:
    """Stream and report; exit code 0."""
    for name in ("batch_size", "limit"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise CommandError(f"--{name.replace('_', '-')} must be at least 1, got {value}", 2)
    if args.step_time is not None and args.step_time < 0:
        raise CommandError(f"--step-time must be 0 or more seconds, got {args.step_time}", 2)
    if args.workers < 0:
        raise CommandError(f"--workers must be 0 or more, got {args.workers}", 2)
    # Never the dataset folder itself by default: streaming decompresses shards into the
    # cache folder, which must not be a user's dataset (or a read-only mount).
    temporary = None if args.local is not None else tempfile.mkdtemp(prefix="astream-bench-")
    local = args.local or temporary
    assert local is not None
    remote = None if is_local(args.url) and os.path.realpath(args.url) == os.path.realpath(local) else args.url
    try:
        result = _stream(args, remote, local)
    finally:
        if temporary is not None:
            shutil.rmtree(temporary, ignore_errors=True)
    if args.json:
        print(json.dumps(result, indent=2))
        return 0
    rate = result["cache_hit_rate"]
    print(f"streamed       {result['samples']:,} samples in {result['batches']:,} batches, {result['seconds']:.2f} s")
    print(f"throughput     {result['samples_per_s']:,.0f} samples/s, {result['data_mb_per_s']:.1f} MB/s of samples, "
          f"{result['download_mb_per_s']:.1f} MB/s downloaded")
    print(f"first batch    {result['first_batch_s'] or 0:.3f} s (index.json: {result['index_s']:.3f} s)")
    print(f"cache          {'-' if rate is None else f'{rate:.1%}'} hit rate ({result['cache_hits']} of "
          f"{result['shard_requests']} shard requests); {result['shards_downloaded']} shards, "
          f"{format_size(result['bytes_downloaded'])} downloaded, {result['retries']} retries")
    print(f"next() waits   p50 {result['wait_p50_s'] * 1e3:.2f} ms, p99 {result['wait_p99_s'] * 1e3:.2f} ms; "
          f"{result['readiness']:.0%} answered at once; stalled {result['stall']:.0%} of the time")
    if result["accelerator_utilisation"] is not None:
        print(f"accelerator    {result['accelerator_utilisation']:.1%} busy at {args.step_time * 1e3:g} ms per step "
              "(from the first batch on)")
    print(f"peak RSS       {format_size(result['peak_rss_bytes'])} (this process, with the node agent; "
          "not the worker processes)")
    return 0
