"""The adapters' workload: epochs of a shuffled ``Loader`` read through one framework's
adapter, each batch taken in that framework's form (no compute on it)."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from typing import Any

__all__ = ["epochs"]


def _runner(path: str, loader: Any) -> Callable[[], int]:
    """A function reading one epoch through ``path``; returns the samples seen."""
    if path == "loader":
        return lambda: sum(len(b["x"]) for b in loader)
    if path == "keras":
        from astream.adapters.keras import StreamingPyDataset

        data = StreamingPyDataset(loader, x="x", y="y")

        def keras_epoch() -> int:  # as fit reads it with workers=1: random access by index
            total = sum(len(data[i][0]) for i in range(len(data)))
            data.on_epoch_end()
            return total

        return keras_epoch
    from astream.adapters.tf import as_tf_dataset

    if path == "tf.data":
        tf_data = as_tf_dataset(loader, x="x", y="y").prefetch(2)
        return lambda: sum(int(x.shape[0]) for x, _ in tf_data)
    if path == "tf.data-graph":  # the iterator in a graph loop, as Keras' TensorFlow backend runs it
        import tensorflow as tf

        graph_data = as_tf_dataset(loader, x="x", y="y").prefetch(2)

        @tf.function  # type: ignore[untyped-decorator]
        def graph_epoch() -> Any:
            seen = tf.constant(0, tf.int64)
            for x, _ in graph_data:
                seen += tf.cast(tf.shape(x)[0], tf.int64)
            return seen

        return lambda: int(graph_epoch())
    if path == "tf.data-stream":  # one endless iterator, as fit(steps_per_epoch=len(loader)) reads it
        steps = len(loader)
        stream = iter(as_tf_dataset(loader, x="x", y="y", epochs=None).prefetch(2))
        return lambda: sum(int(next(stream)[0].shape[0]) for _ in range(steps))
    import jax

    from astream.adapters.jax import device_prefetch

    return lambda: sum(jax.block_until_ready(b["x"]).shape[0] for b in device_prefetch(loader, size=2))  # type: ignore[no-untyped-call]


def epochs(path: str, local: str, batch: int, rounds: int) -> dict[str, Any]:
    """One warm-up epoch (imports, first compilations), then ``rounds`` timed epochs."""
    os.environ.setdefault("KERAS_BACKEND", "jax")
    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")
    from astream import Loader, StreamingDataset

    ds = StreamingDataset(local=local, shuffle=True, batch_size=batch)
    loader = Loader(ds, drop_last=True)
    run = _runner(path, loader)
    expected = ds.size - ds.size % batch
    run()
    times = []
    for _ in range(rounds):
        start = time.perf_counter()
        seen = run()
        times.append(time.perf_counter() - start)
        if seen != expected:
            raise AssertionError(f"{path} delivered {seen} samples, not {expected}")
    loader.close()
    ds.close()
    return {"epoch_s": times, "samples": expected}
