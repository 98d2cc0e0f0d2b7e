"""One Keras backend in one process: fit, stop at 1.5 epochs, resume; print what was seen.

Run as ``KERAS_BACKEND=jax python keras_job.py DIR`` (the backend is fixed at keras'
first import, hence a process per backend). Prints one JSON line.
"""

from __future__ import annotations

import contextlib
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

import astream
from astream.adapters.keras import StreamingCheckpoint, StreamingPyDataset

BATCH = 8
SAMPLES = 100
EPOCHS = 2


class Interrupted(Exception):
    """Stands for the job being killed."""


def write_dataset(path: Path) -> None:
    rng = np.random.default_rng(0)
    w = np.array([1.0, -2.0, 0.5, 3.0], np.float32)
    with astream.MDSWriter(out=str(path), columns={"x": "ndarray:float32:4", "y": "float32", "id": "int64", "s": "str"},
                           size_limit=600) as out:
        for i in range(SAMPLES):
            x = rng.normal(size=4).astype(np.float32)
            out.write({"x": x, "y": np.float32(x @ w), "id": i, "s": f"sample {i}"})


def make_data(path: Path, cache: Path) -> Any:
    ds = astream.StreamingDataset(remote=str(path), local=str(cache), shuffle=True, shuffle_seed=7, batch_size=BATCH)
    return StreamingPyDataset(astream.Loader(ds), x="x", y="y")


def make_model(keras: Any) -> Any:
    # Seeded initialisers, not keras.utils.set_random_seed: that one imports tensorflow.
    init = keras.initializers.GlorotUniform
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="tanh", kernel_initializer=init(1)),
                              keras.layers.Dense(1, kernel_initializer=init(2))])
    model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
    return model


def recorder(keras: Any, data: Any, seen: list[list[int]], stop_after: int | None) -> Any:
    class Record(keras.callbacks.Callback):  # type: ignore[misc]
        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            seen.append([int(i) for i in data.batch_ids(batch)])
            if stop_after is not None and len(seen) == stop_after:
                raise Interrupted

    return Record()


def main() -> None:
    import keras

    root = Path(sys.argv[1])
    write_dataset(root / "ds")
    out: dict[str, Any] = {"backend": keras.backend.backend()}

    # 1. The uninterrupted run.
    full: list[list[int]] = []
    data = make_data(root / "ds", root / "cache-full")
    model = make_model(keras)
    out["initial_weights"] = [w.tolist() for w in model.get_weights()]
    ckpt = StreamingCheckpoint(data, root / "ckpt-full", save_freq=4)
    history = model.fit(data, epochs=EPOCHS, verbose=0, shuffle=False,
                        callbacks=[ckpt, recorder(keras, data, full, None)])
    out["losses"] = [float(v) for v in history.history["loss"]]
    out["full"] = full
    out["full_weights"] = [w.tolist() for w in model.get_weights()]
    out["batches_per_epoch"] = len(data)

    # 2. Stopped after 1.5 epochs (between two checkpoints).
    per_epoch = len(data)
    stop_at = per_epoch + per_epoch // 2
    first: list[list[int]] = []
    data = make_data(root / "ds", root / "cache-run")
    model = make_model(keras)
    ckpt = StreamingCheckpoint(data, root / "ckpt", save_freq=4)
    with contextlib.suppress(Interrupted):
        model.fit(data, epochs=EPOCHS, verbose=0, shuffle=False, callbacks=[ckpt, recorder(keras, data, first, stop_at)])
    saved = json.loads((ckpt.latest() / "astream_state.json").read_text())  # type: ignore[operator]
    out["stopped_at"] = stop_at
    out["checkpoint_steps"] = saved["steps"]
    out["first"] = first

    # 3. A fresh process would do exactly this: new objects, restore, fit on.
    data = make_data(root / "ds", root / "cache-run")
    ckpt = StreamingCheckpoint(data, root / "ckpt", save_freq=4)
    initial_epoch = ckpt.restore()
    model = keras.saving.load_model(ckpt.model_path)
    resumed: list[list[int]] = []
    model.fit(data, epochs=EPOCHS, initial_epoch=initial_epoch, verbose=0, shuffle=False,
              callbacks=[ckpt, recorder(keras, data, resumed, None)])
    out["initial_epoch"] = initial_epoch
    out["resumed"] = resumed
    out["resumed_weights"] = [w.tolist() for w in model.get_weights()]
    print(json.dumps(out))


if __name__ == "__main__":
    main()
