"""Time and peak memory of planning one epoch: astream vs mosaicml-streaming, same inputs.

Each case runs in a fresh subprocess (so peak RSS is its own); the parent prints a table.
The peer's side is exactly what its ``generate_work`` does for ``random`` batching
(``resample_streams`` on the dataset, ``get_partitions``, ``get_shuffle``, two ``np.where``
maps), fed by a stand-in dataset so no shard files are needed. It runs only where
``streaming`` is importable (a venv made as docs/bench/peer.md says).

    python benchmarks/plan_bench.py --repeat 3           # 100M samples in 100k shards
    python benchmarks/plan_bench.py --samples 10_000_000 --shards 10_000
"""

from __future__ import annotations

import argparse
import hashlib
import json
import resource
import subprocess
import sys
import time
from typing import Any

import numpy as np
from peer_stub import stub_streaming_vision

CASES = ("astream-work", "astream-worker", "astream-shuffle", "peer-work", "peer-shuffle")


def _shard_sizes(samples: int, shards: int) -> np.ndarray:
    """Uneven shard sizes (about +-50% around the mean), all positive, summing to ``samples``."""
    rng = np.random.default_rng(0)
    weights = rng.uniform(0.5, 1.5, shards)
    ends = np.round(np.cumsum(weights) / weights.sum() * samples).astype(np.int64)
    return np.diff(ends, prepend=0)


def _status_mb(field: str) -> float:
    """A memory line of /proc/self/status in MB (Linux); VmHWM is the peak resident set."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith(field + ":"):
                return int(line.split()[1]) / 1024
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _digest(a: np.ndarray) -> str:
    return hashlib.sha1(np.ascontiguousarray(a, "<i8").tobytes()).hexdigest()[:16]


def _peer_work(sizes: np.ndarray, a: argparse.Namespace) -> np.ndarray:
    from streaming.base.partition import get_partitions
    from streaming.base.shuffle import get_shuffle

    # resample_streams with every shard drawn once (what StreamingDataset does per epoch).
    shuffle_units: list[Any] = []
    sample_ids: list[Any] = []
    offsets = np.cumsum(sizes) - sizes
    for size, offset in zip(sizes, offsets, strict=True):
        if size:  # its Python loop over shards skips empty ones (0 // 0 repeats)
            shuffle_units.append([size])
            sample_ids.append(offset + np.arange(size))
    units = np.concatenate(shuffle_units).astype(np.int64)
    small_per_big = np.concatenate(sample_ids).astype(np.int64)
    del sample_ids
    big = get_partitions("relaxed", int(sizes.sum()), a.ncn, a.nodes, a.ranks, a.workers, a.batch, 0, None)
    shuffle = get_shuffle(a.algo, units, a.ncn, 9176, a.epoch, a.block)
    big = np.where(big != -1, shuffle[big], -1)
    return np.where(big != -1, small_per_big[big], -1)


def run_case(case: str, a: argparse.Namespace) -> dict[str, Any]:
    """Run one case in this process; return seconds, peak RSS and a digest of the result."""
    sizes = _shard_sizes(a.samples, a.shards)
    if case.startswith("peer"):
        stub_streaming_vision()
        import streaming.base.partition
        import streaming.base.shuffle  # noqa: F401
    import astream.sampling as sampling

    base = _status_mb("VmRSS")
    start = time.perf_counter()
    if case == "astream-work":
        plan = sampling.EpochPlan([{"shard_sizes": sizes}], shuffle=True, shuffle_algo=a.algo,
                                  num_canonical_nodes=a.ncn, shuffle_block_size=a.block, batch_size=a.batch,
                                  num_physical_nodes=a.nodes, ranks_per_node=a.ranks,
                                  workers_per_rank=a.workers, epoch=a.epoch)
        out = plan.work()
    elif case == "astream-worker":
        plan = sampling.EpochPlan([{"shard_sizes": sizes}], shuffle=True, shuffle_algo=a.algo,
                                  num_canonical_nodes=a.ncn, shuffle_block_size=a.block, batch_size=a.batch,
                                  num_physical_nodes=a.nodes, ranks_per_node=a.ranks,
                                  workers_per_rank=a.workers, epoch=a.epoch)
        out = plan.worker_ids(a.nodes - 1, a.ranks - 1, a.workers - 1)
    elif case == "astream-shuffle":
        out = sampling.get_shuffle(a.algo, sizes, a.ncn, 9176, a.epoch, a.block)
    elif case == "peer-work":
        out = _peer_work(sizes, a)
    elif case == "peer-shuffle":
        from streaming.base.shuffle import get_shuffle

        out = get_shuffle(a.algo, sizes, a.ncn, 9176, a.epoch, a.block)
    else:
        raise SystemExit(f"unknown case {case!r}; use one of {CASES}")
    seconds = time.perf_counter() - start
    peak = _status_mb("VmHWM")
    return {"case": case, "seconds": round(seconds, 2), "peak_rss_mb": round(peak),
            "delta_rss_mb": round(peak - base), "shape": list(out.shape), "digest": _digest(out)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--samples", type=lambda s: int(s.replace("_", "")), default=100_000_000)
    p.add_argument("--shards", type=int, default=100_000)
    p.add_argument("--algo", default="py1e")
    p.add_argument("--ncn", type=int, default=8)
    p.add_argument("--block", type=int, default=500_000)
    p.add_argument("--nodes", type=int, default=8)
    p.add_argument("--ranks", type=int, default=8)
    p.add_argument("--workers", type=int, default=8)
    p.add_argument("--batch", type=int, default=32)
    p.add_argument("--epoch", type=int, default=0)
    p.add_argument("--cases", default=",".join(CASES))
    p.add_argument("--repeat", type=int, default=1, help="rounds over all cases; the fastest run is kept")
    p.add_argument("--case", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.case:
        print(json.dumps(run_case(a.case, a)))
        return
    stub_streaming_vision()
    try:
        import streaming  # noqa: F401

        have_peer = True
    except ImportError:
        have_peer = False
    print(f"{a.samples:,} samples in {a.shards:,} shards, {a.algo}, ncn={a.ncn}, block={a.block}, "
          f"world {a.nodes}x{a.ranks}x{a.workers}, batch {a.batch}; numpy {np.__version__}")
    results: dict[str, dict[str, Any]] = {}
    for _ in range(a.repeat):  # rounds alternate the cases, so load changes hit all of them
        for case in a.cases.split(","):
            if case.startswith("peer") and not have_peer:
                continue
            argv = [sys.executable, __file__, "--case", case] + [
                f"--{k}={v}" for k, v in vars(a).items() if k not in ("case", "cases", "repeat")
            ]
            done = subprocess.run(argv, capture_output=True, text=True, check=False)
            if done.returncode:
                print(f"{case:16s} failed: {done.stderr.strip().splitlines()[-1:]}")
                continue
            r = json.loads(done.stdout.strip().splitlines()[-1])
            if case not in results or r["seconds"] < results[case]["seconds"]:
                results[case] = r
    for case in a.cases.split(","):
        if case not in results:
            print(f"{case:16s} skipped (mosaicml-streaming not importable)")
            continue
        r = results[case]
        print(f"{case:16s} {r['seconds']:8.2f} s  peak RSS {r['peak_rss_mb']:7d} MB "
              f"(+{r['delta_rss_mb']} MB)  {r['digest']}")
    for ours, theirs in (("astream-work", "peer-work"), ("astream-shuffle", "peer-shuffle")):
        if ours in results and theirs in results:
            o, t = results[ours], results[theirs]
            same = "identical" if o["digest"] == t["digest"] else "DIFFERENT"
            print(f"{ours} / {theirs}: time {o['seconds'] / t['seconds']:.2f}x, peak RSS "
                  f"{o['peak_rss_mb'] / t['peak_rss_mb']:.2f}x (growth "
                  f"{o['delta_rss_mb'] / max(t['delta_rss_mb'], 1):.2f}x), results {same}")


if __name__ == "__main__":
    main()
