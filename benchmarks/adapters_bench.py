"""Adapter overhead: one epoch through the astream Loader alone vs through each adapter.

Same dataset, same loader settings, warm local shards. Each path reads one epoch per
run and touches every batch (a checksum of ``x``, the least a training step does);
the table gives the median epoch time of ``--runs`` runs and the overhead against the
Loader alone. Paths:

- ``loader``: ``for batch in loader``.
- ``keras``: ``StreamingPyDataset[i]`` for every ``i``, as ``fit`` reads it with
  ``workers=1`` (random access: ``Loader.batch_ids`` + ``get_batch``).
- ``tf.data``: ``as_tf_dataset(loader, x=..., y=...).prefetch(2)``, iterated eagerly.
- ``jax``: ``device_prefetch(loader)``, waiting for each batch to be on the device.

    KERAS_BACKEND=jax python benchmarks/adapters_bench.py --runs 5
    python benchmarks/adapters_bench.py --samples 4000 --runs 3 --paths loader,keras
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

os.environ.setdefault("KERAS_BACKEND", "jax")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import astream

PATHS = ("loader", "keras", "tf.data", "jax")


def write(path: Path, samples: int) -> None:
    rng = np.random.default_rng(0)
    with astream.MDSWriter(out=str(path), columns={"x": "ndarray:uint8:3,32,32", "y": "int64"},
                           size_limit="8mb") as out:
        for i in range(samples):
            out.write({"x": rng.integers(0, 255, (3, 32, 32), dtype=np.uint8), "y": i % 10})


def make_loader(path: Path, batch_size: int) -> astream.Loader:
    ds = astream.StreamingDataset(local=str(path), shuffle=True, batch_size=batch_size)
    return astream.Loader(ds, drop_last=True)


def epoch_runner(name: str, loader: astream.Loader) -> Callable[[], int]:
    """A function that reads one epoch through path ``name`` and returns a checksum."""
    if name == "loader":
        return lambda: sum(int(b["x"][:, 0, 0, 0].sum()) for b in loader)
    if name == "keras":
        from astream.adapters.keras import StreamingPyDataset

        data = StreamingPyDataset(loader, x="x", y="y")

        def keras_epoch() -> int:
            total = sum(int(data[i][0][:, 0, 0, 0].sum()) for i in range(len(data)))
            data.on_epoch_end()
            return total

        return keras_epoch
    if name == "tf.data":
        from astream.adapters.tf import as_tf_dataset

        tf_data = as_tf_dataset(loader, x="x", y="y").prefetch(2)
        return lambda: sum(int(x[:, 0, 0, 0].numpy().sum()) for x, _ in tf_data)
    if name == "jax":
        import jax

        from astream.adapters.jax import device_prefetch

        def jax_epoch() -> int:
            total = 0
            for b in device_prefetch(loader, size=2):
                total += int(jax.block_until_ready(b["x"])[:, 0, 0, 0].sum())
            return total

        return jax_epoch
    raise SystemExit(f"unknown path {name!r}; choose from {', '.join(PATHS)}")


def measure(run: Callable[[], Any], runs: int) -> tuple[float, list[float]]:
    run()  # warm: imports, first compilations, page cache
    times = []
    for _ in range(runs):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return statistics.median(times), times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=16_384)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--paths", default=",".join(PATHS))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="astream-adapters-bench-") as tmp:
        data = Path(tmp) / "ds"
        write(data, args.samples)
        results = {}
        for name in args.paths.split(","):
            loader = make_loader(data, args.batch_size)
            median, times = measure(epoch_runner(name, loader), args.runs)
            results[name] = median
            loader.dataset.close()
            print(f"{name:8s} median {median * 1e3:8.1f} ms/epoch  runs {[round(t * 1e3, 1) for t in times]}", flush=True)
        base = results.get("loader")
        print(f"\n{args.samples} samples of 3 KB, batch {args.batch_size}, {args.runs} runs (median)\n")
        print("| path | ms / epoch | samples / s | overhead vs Loader |")
        print("|---|---:|---:|---:|")
        for name, median in results.items():
            overhead = "" if base is None or name == "loader" else f"{(median / base - 1) * 100:+.1f}%"
            print(f"| {name} | {median * 1e3:.1f} | {args.samples / median:,.0f} | {overhead} |")


if __name__ == "__main__":
    main()
