"""Adapter overhead: one epoch through the astream Loader alone vs through each adapter.

Same dataset, same loader settings, warm local shards. Each path reads one epoch per
run and takes delivery of every batch in its framework's form (no compute on it);
the table gives the median epoch time of ``--runs`` rounds (the paths take turns in
each round) and the overhead against the Loader alone. Paths:

- ``loader``: ``for batch in loader``.
- ``keras``: ``StreamingPyDataset[i]`` for every ``i``, as ``fit`` reads it with
  ``workers=1`` (random access: ``Loader.batch_ids`` + ``get_batch``).
- ``tf.data``: ``as_tf_dataset(loader, x=..., y=...).prefetch(2)``, iterated eagerly
  (``for x, y in dataset``; also how Keras' JAX and torch backends read a dataset).
- ``tf.data-graph``: the same dataset read inside one ``tf.function`` (``for x, y in
  dataset`` traced into a graph loop): the ``iterator.get_next()`` in a graph that
  Keras' TensorFlow backend runs, without its per-step function call.
- ``tf.data-stream``: ``as_tf_dataset(loader, x=..., y=..., epochs=None).prefetch(2)``
  with one iterator kept across the rounds, ``len(loader)`` batches per round: how
  ``fit(..., steps_per_epoch=len(loader))`` reads an endless dataset (one iterator for
  the whole fit), so TensorFlow's per-iterator setup and teardown is not in the epoch.
- ``jax``: ``device_prefetch(loader)``, waiting for each batch to be on the device.

    KERAS_BACKEND=jax python benchmarks/adapters_bench.py --runs 5
    python benchmarks/adapters_bench.py --samples 4096 --shape 3,64,64 --batch-size 128
    python benchmarks/adapters_bench.py --runs 3 --paths loader,keras
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

PATHS = ("loader", "keras", "tf.data", "tf.data-graph", "tf.data-stream", "jax")


def write(path: Path, samples: int, shape: tuple[int, ...]) -> None:
    rng = np.random.default_rng(0)
    spec = "ndarray:uint8:" + ",".join(map(str, shape))
    with astream.MDSWriter(out=str(path), columns={"x": spec, "y": "int64"}, size_limit="16mb") as out:
        for i in range(samples):
            out.write({"x": rng.integers(0, 255, shape, dtype=np.uint8), "y": i % 10})


def make_loader(path: Path, batch_size: int) -> astream.Loader:
    ds = astream.StreamingDataset(local=str(path), shuffle=True, batch_size=batch_size)
    return astream.Loader(ds, drop_last=True)


def epoch_runner(name: str, loader: astream.Loader) -> Callable[[], int]:
    """A function that reads one epoch through path ``name`` and returns the samples seen.

    Each path takes delivery of every batch in its framework's form and counts it; no
    path computes on the data, so the difference is what the adapter costs.
    """
    if name == "loader":
        return lambda: sum(len(b["x"]) for b in loader)
    if name == "keras":
        from astream.adapters.keras import StreamingPyDataset

        data = StreamingPyDataset(loader, x="x", y="y")

        def keras_epoch() -> int:
            total = sum(len(data[i][0]) for i in range(len(data)))
            data.on_epoch_end()
            return total

        return keras_epoch
    if name == "tf.data":
        from astream.adapters.tf import as_tf_dataset

        tf_data = as_tf_dataset(loader, x="x", y="y").prefetch(2)
        return lambda: sum(int(x.shape[0]) for x, _ in tf_data)
    if name == "tf.data-graph":
        import tensorflow as tf

        from astream.adapters.tf import as_tf_dataset

        graph_data = as_tf_dataset(loader, x="x", y="y").prefetch(2)

        @tf.function
        def graph_epoch() -> Any:
            seen = tf.constant(0, tf.int64)
            for x, _ in graph_data:
                seen += tf.cast(tf.shape(x)[0], tf.int64)
            return seen

        return lambda: int(graph_epoch())
    if name == "tf.data-stream":
        from astream.adapters.tf import as_tf_dataset

        steps = len(loader)
        stream = iter(as_tf_dataset(loader, x="x", y="y", epochs=None).prefetch(2))
        return lambda: sum(int(next(stream)[0].shape[0]) for _ in range(steps))
    if name == "jax":
        import jax

        from astream.adapters.jax import device_prefetch

        return lambda: sum(jax.block_until_ready(b["x"]).shape[0] for b in device_prefetch(loader, size=2))
    raise SystemExit(f"unknown path {name!r}; choose from {', '.join(PATHS)}")


def measure(runners: dict[str, Callable[[], int]], runs: int, samples: int) -> dict[str, list[float]]:
    """Epoch times per path; the paths take turns in each round, so load drifts hit them alike."""
    for run in runners.values():
        run()  # warm: imports, first compilations, page cache
    times: dict[str, list[float]] = {name: [] for name in runners}
    for _ in range(runs):
        for name, run in runners.items():
            start = time.perf_counter()
            seen = run()
            times[name].append(time.perf_counter() - start)
            if seen != samples:
                raise SystemExit(f"{name} delivered {seen} samples, expected {samples}")
    return times


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--samples", type=int, default=16_384)
    parser.add_argument("--batch-size", type=int, default=256)
    parser.add_argument("--shape", default="3,32,32", help="per-sample uint8 image shape")
    parser.add_argument("--runs", type=int, default=5)
    parser.add_argument("--paths", default=",".join(PATHS))
    args = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="astream-adapters-bench-") as tmp:
        data = Path(tmp) / "ds"
        shape = tuple(int(d) for d in args.shape.split(","))
        write(data, args.samples, shape)
        loaders = {name: make_loader(data, args.batch_size) for name in args.paths.split(",")}
        runners = {name: epoch_runner(name, loader) for name, loader in loaders.items()}
        expected = args.samples - args.samples % args.batch_size  # drop_last
        times = measure(runners, args.runs, expected)
        results = {name: statistics.median(t) for name, t in times.items()}
        for name, t in times.items():
            print(f"{name:14s} median {results[name] * 1e3:8.1f} ms/epoch  runs {[round(x * 1e3, 1) for x in t]}")
        for loader in loaders.values():
            loader.dataset.close()
        base = results.get("loader")
        kb = np.prod(shape) / 1024
        print(f"\n{args.samples} samples of {kb:g} KB, batch {args.batch_size}, {args.runs} rounds (median)\n")
        print("| path | ms / epoch | samples / s | overhead vs Loader |")
        print("|---|---:|---:|---:|")
        for name, median in results.items():
            overhead = "" if base is None or name == "loader" else f"{(median / base - 1) * 100:+.1f}%"
            print(f"| {name} | {median * 1e3:.1f} | {args.samples / median:,.0f} | {overhead} |")


if __name__ == "__main__":
    main()
