"""What starting the worker processes costs the first epoch, after its first batch.

One ``Loader(num_workers=W)`` per fresh process, iterated ``--epochs`` epochs over a local
MDS dataset (warm page cache): the first epoch's first batch comes from the stand-ins
while the forkserver and the workers start in the background; what their start costs
the epoch shows as the first epoch's time after its first batch against the later
epochs' (the workers run already). Reports, per run, ``first batch / rest`` of each epoch
in ms, and the median over runs of (first epoch's rest - median of the later ones).

    python benchmarks/first_epoch_bench.py --data /tmp/astream-bench/peers/small --runs 3
    python benchmarks/first_epoch_bench.py --data DIR --workers 2 --epoch-scale 10 --epochs 4

``--data`` is an MDS folder (``peers_bench.py`` writes ``small`` and ``large`` under
``$ASTREAM_BENCH_DATA/peers``); ``--epoch-scale N`` makes an epoch N times the dataset
(``epoch_size``), so an epoch lasts long enough to see the start in it.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import time

BATCH = 32


def child(data: str, workers: int, scale: int, epochs: int) -> None:
    from astream import Loader, StreamingDataset

    probe = StreamingDataset(local=data, batch_size=BATCH)
    size = probe.size
    probe.close()
    ds = StreamingDataset(local=data, batch_size=BATCH, epoch_size=size * scale if scale > 1 else None)
    out = []
    with Loader(ds, num_workers=workers) as loader:
        for _ in range(epochs):
            start = time.perf_counter()
            first = None
            for _batch in loader:
                if first is None:
                    first = time.perf_counter()
            end = time.perf_counter()
            assert first is not None
            out.append((first - start, end - first))
    ds.close()
    print(json.dumps(out))


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--data", required=True)
    p.add_argument("--workers", type=int, default=2)
    p.add_argument("--epoch-scale", type=int, default=10)
    p.add_argument("--epochs", type=int, default=4)
    p.add_argument("--runs", type=int, default=3)
    p.add_argument("--child", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.child:
        child(args.data, args.workers, args.epoch_scale, args.epochs)
        return
    print(f"load average at start: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    extra = []
    for run in range(args.runs):
        done = subprocess.run(
            [sys.executable, __file__, "--child", "--data", args.data, "--workers", str(args.workers),
             "--epoch-scale", str(args.epoch_scale), "--epochs", str(args.epochs)],
            capture_output=True, text=True, check=True,
        )
        epochs = json.loads(done.stdout.strip().splitlines()[-1])
        later = statistics.median(rest for _, rest in epochs[1:])
        extra.append(epochs[0][1] - later)
        print(f"run {run}: " + " ".join(f"{a * 1e3:.0f}/{b * 1e3:.0f}" for a, b in epochs)
              + f" ms; first epoch's rest - later epochs' = {extra[-1] * 1e3:+.0f} ms")
    print(f"load average at end: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"workers={args.workers}: the start costs the first epoch {statistics.median(extra) * 1e3:+.0f} ms "
          f"after its first batch (median of {args.runs})")


if __name__ == "__main__":
    main()
