"""A dataset larger than the cache (issue #14). Results: docs/bench/cache.md.

One node, ``--ranks`` rank processes (each a ``Loader`` without workers), a py1e shuffle
at MosaicML's default block size and at a smaller one, a dataset behind the loopback
HTTP server, and ``cache_limit`` at fractions of the dataset. Each run reports the bytes
downloaded in the epoch (counted by the server), the epoch's wall time, the peak of the
shard files on disk (temporaries included, sampled every millisecond), and the offline
optimum (Belady with the node's whole plan, :func:`astream._cache.eviction.offline_optimum`)
with the ratio to it. Every run checks the epoch is exact.

With ``--peer PYTHON`` (a venv with torch and mosaicml-streaming 0.13, see
docs/bench/peer.md) each configuration also runs mosaicml-streaming's ranks
(``benchmarks/cache_peer_rank.py``, direct iteration, the same py1e order) against the same
server as an S3 endpoint, with the same ``cache_limit``.

Usage::

    python benchmarks/cache_bench.py [--shards 240] [--shard-kb 256] [--sample-kb 16] [--ranks 4]
                                     [--batch 4] [--limits 0.1,0.25,0.5] [--small-block 1200]
                                     [--runs 1] [--json out.json] [--peer PEER_PYTHON]
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import warnings
from pathlib import Path
from typing import Any

import numpy as np

from astream import Loader, MDSWriter, StreamingDataset
from astream._cache.eviction import min_cache_bytes, offline_optimum, simulate
from astream._coord.world import World
from astream.errors import CacheWarning
from astream.testing import LoopbackServer

BUCKET = "bench"


def child(args: argparse.Namespace) -> None:
    """One rank: an epoch through a Loader; rank 0 reports the agent's counters after all are done."""
    from astream._dataset.dataset import _main_member
    from astream._dataset.runtime import portal

    warnings.simplefilter("ignore", CacheWarning)
    rank, ranks = int(os.environ["RANK"]), int(os.environ["LOCAL_WORLD_SIZE"])
    ds = StreamingDataset(remote=args.remote, local=args.cache, shuffle=True, shuffle_algo="py1e",
                          shuffle_block_size=args.block, batch_size=args.batch, cache_limit=args.limit)
    start = time.perf_counter()
    ids = [int(i) for batch in Loader(ds) for i in batch["id"]]
    took = time.perf_counter() - start

    async def stats() -> dict[str, Any]:
        node = await ds.node()
        await node.barrier("bench-done", [_main_member(r) for r in range(ranks)])
        return await node.stats()

    out = portal().call(stats())
    ds.close()
    Path(args.out).write_text(json.dumps({"ids": ids, "seconds": took, "stats": out if rank == 0 else None}))


class DiskWatch(threading.Thread):
    def __init__(self, folder: Path) -> None:
        super().__init__(daemon=True)
        self.folder, self.peak, self.done = folder, 0, threading.Event()

    def run(self) -> None:
        while not self.done.is_set():
            total = 0
            for dirpath, _, names in os.walk(self.folder):
                for name in names:
                    if name.startswith("shard."):
                        with contextlib.suppress(FileNotFoundError):
                            total += os.stat(os.path.join(dirpath, name)).st_size
            self.peak = max(self.peak, total)
            time.sleep(0.001)


PEER_RANK = Path(__file__).with_name("cache_peer_rank.py")


def one_run(server: LoopbackServer, work: Path, ranks: int, batch: int, limit: int, block: int | None,
            peer: str | None = None) -> dict[str, Any]:
    cache = Path(tempfile.mkdtemp(dir=work))
    before = len(server.log)
    procs, outs = [], []
    watch = DiskWatch(cache)
    watch.start()
    start = time.perf_counter()
    for rank in range(ranks):
        out = cache.parent / f"{cache.name}-rank{rank}.json"
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": str(ranks), "LOCAL_RANK": str(rank),
               "LOCAL_WORLD_SIZE": str(ranks), "ASTREAM_RUN_ID": cache.name}
        if peer is None:
            cmd = [sys.executable, __file__, "--child", "--remote", f"{server.url}/{BUCKET}/ds"]
        else:
            tmp = cache.parent / f"{cache.name}-tmp"  # its locks; /dev/shm names come from the cache path
            tmp.mkdir(exist_ok=True)
            env.update(S3_ENDPOINT_URL=server.url, AWS_ACCESS_KEY_ID="x", AWS_SECRET_ACCESS_KEY="x",
                       MASTER_ADDR="127.0.0.1", MASTER_PORT=str(20000 + os.getpid() % 20000), TMPDIR=str(tmp))
            cmd = [peer, str(PEER_RANK), "--remote", f"s3://{BUCKET}/ds"]
        cmd += ["--cache", str(cache), "--out", str(out), "--batch", str(batch), "--limit", str(limit)]
        cmd += ["--block", str(block)] if block else []
        procs.append(subprocess.Popen(cmd, env=env))
        outs.append(out)
    for proc in procs:
        if proc.wait(timeout=1200) != 0:
            raise SystemExit(f"a rank failed ({proc.returncode})")
    wall = time.perf_counter() - start
    watch.done.set()
    watch.join()
    results = [json.loads(o.read_text()) for o in outs]
    got = [r for r in server.log[before:] if r.method == "GET" and ".mds" in r.path and r.range is None]
    return {"wall": wall, "rank_seconds": max(r["seconds"] for r in results), "ids": [r["ids"] for r in results],
            "requests": got, "peak": watch.peak,
            "stats": results[0]["stats"]["provider"] if results[0].get("stats") else None}


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--child", action="store_true")
    parser.add_argument("--remote")
    parser.add_argument("--cache")
    parser.add_argument("--out")
    parser.add_argument("--block", type=int, default=None)
    parser.add_argument("--limit", type=int, default=0)
    parser.add_argument("--shards", type=int, default=240)
    parser.add_argument("--shard-kb", type=int, default=256)
    parser.add_argument("--sample-kb", type=int, default=16)
    parser.add_argument("--ranks", type=int, default=4)
    parser.add_argument("--batch", type=int, default=4)
    parser.add_argument("--limits", default="0.1,0.25,0.5")
    parser.add_argument("--small-block", type=int, default=1200)
    parser.add_argument("--runs", type=int, default=1)
    parser.add_argument("--json", default=None)
    parser.add_argument("--peer", default=None, help="python of a venv with mosaicml-streaming")
    args = parser.parse_args()
    if args.child:
        child(args)
        return
    work = Path(tempfile.mkdtemp(prefix="cache-bench-"))
    per_shard = max(1, args.shard_kb // args.sample_kb)
    samples = args.shards * per_shard
    rng = np.random.default_rng(0)
    remote = work / "srv" / BUCKET / "ds"
    with MDSWriter(out=str(remote), columns={"id": "int64", "x": "bytes"},
                   size_limit=f"{args.shard_kb * 1024 + 4096}b") as w:
        for i in range(samples):
            w.write({"id": i, "x": rng.bytes(args.sample_kb * 1024 - 64)})
    index = json.loads((remote / "index.json").read_text())
    sizes = [s["raw_data"]["bytes"] for s in index["shards"]]
    total = sum(sizes)
    print(f"dataset: {samples} samples, {len(sizes)} shards, {total / 1e6:.1f} MB; {args.ranks} ranks, "
          f"batch {args.batch}; minimum cache {min_cache_bytes(sizes, args.batch, args.ranks) / 1e6:.2f} MB")
    rows = []
    with LoopbackServer(str(work / "srv")) as server:
        for block in (None, args.small_block):
            probe = StreamingDataset(remote=f"{server.url}/{BUCKET}/ds", local=str(work / "probe"), shuffle=True, shuffle_algo="py1e",
                                     shuffle_block_size=block, batch_size=args.batch,
                                     world=World(rank=0, world_size=args.ranks, local_rank=0,
                                                 ranks_per_node=args.ranks))
            plan = probe.plan(epoch=0, sample_in_epoch=0, workers_per_rank=1)
            orders = []
            for rank in range(args.ranks):
                ids = plan.worker_ids(0, rank, 0)
                orders.append(plan.shard_of(ids[ids >= 0]))
            expected = [plan.rank_order(0, r).tolist() for r in range(args.ranks)]
            for fraction in (float(f) for f in args.limits.split(",")):
                limit = int(total * fraction)
                opt = offline_optimum(orders, sizes, limit, batch_size=args.batch)
                sim = simulate(orders, sizes, limit, batch_size=args.batch, predownload=8 * args.batch)
                runs = [one_run(server, work, args.ranks, args.batch, limit, block) for _ in range(args.runs)]
                for run in runs:
                    assert run["ids"] == expected, "the epoch was not exact"
                got = statistics.median(sum(sizes[int(r.path.rsplit(".", 2)[-2])] for r in run["requests"])
                                        for run in runs)
                row = {
                    "block": block or plan.shuffle_block_size, "fraction": fraction, "limit_mb": limit / 1e6,
                    "downloaded_mb": got / 1e6, "optimum_mb": opt.bytes_downloaded / 1e6,
                    "simulated_mb": sim.bytes_downloaded / 1e6, "ratio": got / opt.bytes_downloaded,
                    "epoch_s": statistics.median(r["wall"] for r in runs),
                    "rank_s": statistics.median(r["rank_seconds"] for r in runs),
                    "peak_disk_mb": max(r["peak"] for r in runs) / 1e6,
                    "peak_accounted_mb": max(r["stats"]["peak_cache_bytes"] for r in runs) / 1e6,
                    "evictions": statistics.median(r["stats"]["evictions"] for r in runs),
                    "redownloads": statistics.median(r["stats"]["redownloads"] for r in runs),
                    "within_limit": all(r["peak"] <= limit for r in runs),
                }
                if args.peer:
                    peers = [one_run(server, work, args.ranks, args.batch, limit, block, args.peer)
                             for _ in range(args.runs)]
                    row["peer_exact"] = all(p["ids"] == expected for p in peers)
                    row["peer_downloaded_mb"] = statistics.median(
                        sum(sizes[int(r.path.rsplit(".", 2)[-2])] for r in p["requests"]) for p in peers) / 1e6
                    row["peer_epoch_s"] = statistics.median(p["wall"] for p in peers)
                    row["peer_rank_s"] = statistics.median(p["rank_seconds"] for p in peers)
                    row["peer_peak_disk_mb"] = max(p["peak"] for p in peers) / 1e6
                    print(f"    mosaicml-streaming: downloaded {row['peer_downloaded_mb']:7.2f} MB "
                          f"(x{row['peer_downloaded_mb'] / row['optimum_mb']:.3f} the optimum), epoch "
                          f"{row['peer_epoch_s']:.2f} s (ranks {row['peer_rank_s']:.2f} s), peak on disk {row['peer_peak_disk_mb']:.2f} MB, "
                          f"same order: {row['peer_exact']}", flush=True)
                rows.append(row)
                print(f"block {row['block']:>7}  limit {fraction:>4} ({row['limit_mb']:6.2f} MB): downloaded "
                      f"{row['downloaded_mb']:7.2f} MB, optimum {row['optimum_mb']:7.2f} MB (x{row['ratio']:.3f}), "
                      f"simulated {row['simulated_mb']:7.2f} MB; epoch {row['epoch_s']:.2f} s (ranks "
                      f"{row['rank_s']:.2f} s); peak on disk {row['peak_disk_mb']:.2f} MB "
                      f"({'within' if row['within_limit'] else 'OVER'} the limit)", flush=True)
    if args.json:
        Path(args.json).write_text(json.dumps(rows, indent=2))


if __name__ == "__main__":
    main()
