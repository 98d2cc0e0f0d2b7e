"""Everything the adapter tests need from one Keras backend, in one fresh process.

``KERAS_BACKEND=jax python framework_job.py DIR`` (the backend is fixed at keras' first
import, and TF/JAX imports are slow: one process per backend does all the work).
Prints one JSON line of observations; tests/adapters/test_frameworks.py judges them.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np
from adapterkit import make_loader, write_dataset

from astream.adapters.keras import StreamingCheckpoint, StreamingEpochs, StreamingPyDataset
from astream.errors import UsageError

EPOCHS = 2


class Interrupted(Exception):
    """Stands for the job being killed."""


def make_model(keras: Any) -> Any:
    # Seeded initialisers, not keras.utils.set_random_seed: that one imports tensorflow.
    init = keras.initializers.GlorotUniform
    model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(8, activation="tanh", kernel_initializer=init(1)),
                              keras.layers.Dense(1, kernel_initializer=init(2))])
    model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
    return model


def recorder(keras: Any, data: Any, seen: list[list[int]], stop_after: int | None = None) -> Any:
    """Records the ids of each batch trained on (Keras trains batch i of the epoch at step i)."""

    class Record(keras.callbacks.Callback):  # type: ignore[misc]
        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            seen.append([int(i) for i in data.batch_ids(batch)])
            if stop_after is not None and len(seen) == stop_after:
                raise Interrupted

    return Record()


def weights(model: Any) -> list[Any]:
    return [w.tolist() for w in model.get_weights()]


def keras_checks(keras: Any, root: Path, out: dict[str, Any]) -> None:
    ds_path = root / "ds"
    received: list[list[int]] = []

    def xy(batch: dict[str, Any]) -> Any:
        received.append([int(i) for i in batch["id"]])
        return batch["x"], batch["y"]

    # 1. The uninterrupted run: 2 epochs.
    full: list[list[int]] = []
    data = StreamingPyDataset(make_loader(ds_path, root / "cache-full"), map_fn=xy)
    model = make_model(keras)
    ckpt = StreamingCheckpoint(data, root / "ckpt-full", save_freq=4)
    history = model.fit(data, epochs=EPOCHS, verbose=0, shuffle=False, callbacks=[ckpt, recorder(keras, data, full)])
    out["losses"] = [float(v) for v in history.history["loss"]]
    out["full"] = full
    out["full_received"] = received[-len(full):]
    out["full_weights"] = weights(model)
    out["batches_per_epoch"] = len(data)
    loader = make_loader(ds_path, root / "cache-loader")
    out["loader_epochs"] = [[[int(i) for i in b["id"]] for b in loader] for _ in range(EPOCHS)]

    # 2. Stopped after 1.5 epochs, between two checkpoints.
    per_epoch = len(data)
    stop_at = per_epoch + per_epoch // 2
    first: list[list[int]] = []
    data = StreamingPyDataset(make_loader(ds_path, root / "cache-run"), x="x", y="y")
    model = make_model(keras)
    ckpt = StreamingCheckpoint(data, root / "ckpt", save_freq=4)
    with contextlib.suppress(Interrupted):
        model.fit(data, epochs=EPOCHS, verbose=0, shuffle=False, callbacks=[ckpt, recorder(keras, data, first, stop_at)])
    latest = ckpt.latest()
    assert latest is not None
    out["checkpoint_steps"] = json.loads((latest / "astream_state.json").read_text())["steps"]
    out["stopped_at"] = stop_at
    out["first"] = first

    # 3. What a new process does: new objects, restore, fit on.
    data = StreamingPyDataset(make_loader(ds_path, root / "cache-run"), x="x", y="y")
    ckpt = StreamingCheckpoint(data, root / "ckpt", save_freq=4)
    initial_epoch = ckpt.restore()
    model = keras.saving.load_model(ckpt.model_path)
    resumed: list[list[int]] = []
    model.fit(data, epochs=EPOCHS, initial_epoch=initial_epoch, verbose=0, shuffle=False,
              callbacks=[ckpt, recorder(keras, data, resumed)])
    out["initial_epoch"] = initial_epoch
    out["resumed"] = resumed
    out["resumed_weights"] = weights(model)

    # 4. Keras reading with threads gives the same batches; fit's default shuffle is refused.
    threaded: list[list[int]] = []

    def xy_threaded(batch: dict[str, Any]) -> Any:
        threaded.append(sorted(int(i) for i in batch["id"]))  # threads: arrival order is theirs
        return batch["x"], batch["y"]

    data = StreamingPyDataset(make_loader(ds_path, root / "cache-threads"), map_fn=xy_threaded, workers=3)
    model = make_model(keras)
    model.fit(data, epochs=EPOCHS, verbose=0, shuffle=False, callbacks=[StreamingEpochs(data)])
    out["threaded"] = threaded
    # No callback at all: the dataset moves on when an epoch was read through.
    data = StreamingPyDataset(make_loader(ds_path, root / "cache-bare"), x="x", y="y")
    model = make_model(keras)
    model.fit(data, epochs=EPOCHS, verbose=0, shuffle=False)
    out["bare_weights"] = weights(model)
    data = StreamingPyDataset(make_loader(ds_path, root / "cache-shuffle"), x="x", y="y")
    try:
        make_model(keras).fit(data, epochs=1, verbose=0)
        out["shuffle_error"] = None
    except UsageError as exc:
        out["shuffle_error"] = str(exc)
    except Exception as exc:  # the TF backend reads in a tf.data op, which wraps the error
        out["shuffle_error"] = f"{type(exc).__name__}: {exc}"


def tf_checks(keras: Any, root: Path, out: dict[str, Any]) -> None:
    import tensorflow as tf

    from astream.adapters.tf import as_tf_dataset

    loader = make_loader(root / "ds", root / "cache-tf")
    dataset = as_tf_dataset(loader)
    out["tf_spec"] = {k: [v.dtype.name, v.shape.as_list()] for k, v in dataset.element_spec.items()}
    out["tf_cardinality"] = int(dataset.cardinality().numpy())
    first = next(iter(dataset))
    out["tf_first"] = {"s_dtype": first["s"].dtype.name, "s": [v.decode() for v in first["s"].numpy()[:3].tolist()],
                       "id": first["id"].numpy().tolist(), "x_shape": first["x"].shape.as_list()}

    loader = make_loader(root / "ds", root / "cache-tf-fit", drop_last=True)
    train = as_tf_dataset(loader, x="x", y="y")
    out["tf_fit_spec"] = [[s.dtype.name, s.shape.as_list()] for s in train.element_spec]
    model = make_model(keras)
    history = model.fit(train.map(lambda x, y: (x, tf.expand_dims(y, -1))).prefetch(2), epochs=3, verbose=0)
    out["tf_losses"] = [float(v) for v in history.history["loss"]]
    out["tf_last_epoch"] = loader.state_dict()["epoch"]  # 2 when each Keras epoch began one loader epoch
    ids = as_tf_dataset(make_loader(root / "ds", root / "cache-tf-ids"), columns=["id"])
    out["tf_ids"] = [[int(i) for i in b["id"].numpy()] for b in ids]

    def id_lists(dataset: Any) -> list[list[int]]:
        return [[int(i) for i in b["id"].numpy()] for b in dataset]

    # Two loader epochs in one pass: the loader's order across the epoch boundary.
    two = as_tf_dataset(make_loader(root / "ds", root / "cache-tf-two"), columns=["id"], epochs=2)
    out["tf_two_epochs"] = id_lists(two)
    out["tf_two_cardinality"] = int(two.cardinality().numpy())

    # Resume mid-epoch from a state (after 5 batches), as an endless stream.
    first = make_loader(root / "ds", root / "cache-tf-resume")
    batches = iter(first)
    for _ in range(5):
        next(batches)
    state = first.state_dict()
    batches.close()
    resumed = make_loader(root / "ds", root / "cache-tf-resume")
    resumed.load_state_dict(state)
    endless = as_tf_dataset(resumed, columns=["id"], epochs=None)
    out["tf_endless_cardinality"] = int(endless.cardinality().numpy())
    out["tf_resumed"] = id_lists(endless.take(2 * len(out["tf_ids"]) - 5))

    # A collate_fn with output_signature; a batch that does not fit the spec is an error.
    def collate(samples: list[dict[str, Any]]) -> dict[str, Any]:
        return {"id": np.array([s["id"] for s in samples], np.int64)}

    spec = {"id": tf.TensorSpec((None,), tf.int64)}
    collated = as_tf_dataset(make_loader(root / "ds", root / "cache-tf-collate", collate_fn=collate),
                             output_signature=spec)
    out["tf_collated"] = id_lists(collated)
    wrong = as_tf_dataset(make_loader(root / "ds", root / "cache-tf-wrong", collate_fn=collate),
                          output_signature={"id": tf.TensorSpec((3,), tf.int64)})
    try:
        id_lists(wrong)
        out["tf_wrong_shape_error"] = None
    except Exception as exc:  # raised in the numpy_function, TF wraps it
        out["tf_wrong_shape_error"] = f"{type(exc).__name__}: {exc}"


def jax_checks(root: Path, out: dict[str, Any]) -> None:
    import jax
    from jax.sharding import Mesh, NamedSharding, PartitionSpec

    from astream.adapters.jax import adevice_prefetch, device_prefetch

    got = list(device_prefetch(make_loader(root / "ds", root / "cache-jax"), size=2))
    x = got[0]["x"]
    out["jax_batches"] = [[int(i) for i in np.asarray(b["id"])] for b in got]
    out["jax_types"] = sorted({type(b["x"]).__name__ for b in got} | {type(b["s"]).__name__ for b in got})
    out["jax_on_device"] = all(isinstance(b[c], jax.Array) and b[c].devices() == {jax.devices()[0]}
                               for b in got for c in ("x", "y", "id"))
    out["jax_x_shape"] = list(x.shape)

    mesh = Mesh(np.array(jax.devices()), ("data",))
    sharding = NamedSharding(mesh, PartitionSpec("data"))
    batch = next(iter(device_prefetch(make_loader(root / "ds", root / "cache-jax-sh", drop_last=True),
                                      sharding=sharding)))
    out["jax_devices"] = len(jax.devices())
    out["jax_shards"] = [list(s.data.shape) for s in batch["x"].addressable_shards]
    out["jax_sharding_ok"] = batch["x"].sharding.is_equivalent_to(sharding, 2)

    async def first_two() -> list[list[int]]:
        seen = []
        stream = adevice_prefetch(make_loader(root / "ds", root / "cache-jax-async"))
        async for b in stream:
            seen.append([int(i) for i in np.asarray(b["id"])])
            if len(seen) == 2:
                break
        await stream.aclose()
        return seen

    out["jax_async"] = asyncio.run(first_two())


def main() -> None:
    import keras

    root = Path(sys.argv[1])
    write_dataset(root / "ds")
    backend = keras.backend.backend()
    out: dict[str, Any] = {"backend": backend}
    keras_checks(keras, root, out)
    if backend == "tensorflow":
        tf_checks(keras, root, out)
    if backend == "jax":
        jax_checks(root, out)
    print(json.dumps(out))


if __name__ == "__main__":
    main()
