"""One of two processes of a multi-process Keras 3 job (JAX backend, ``jax.distributed``).

``python keras_dist_job.py PROCESS_ID PORT DATA CACHE`` prints one JSON line. No
RANK/WORLD_SIZE: astream finds its place from ``jax.distributed`` (one process per host),
each process's ``StreamingPyDataset`` yields this process's batches, and Keras'
``DataParallel(auto_shard_dataset=False)`` joins them into one global batch per step.
"""

from __future__ import annotations

import json
import os
import sys

os.environ["KERAS_BACKEND"] = "jax"

import jax
import keras
import numpy as np
from adapterkit import make_loader

from astream.adapters.keras import StreamingEpochs, StreamingPyDataset


def main() -> None:
    process, port, data, cache = int(sys.argv[1]), sys.argv[2], sys.argv[3], sys.argv[4]
    jax.distributed.initialize(coordinator_address=f"127.0.0.1:{port}", num_processes=2, process_id=process)
    out: dict[str, object] = {"process": process}

    loader = make_loader(data, cache)  # this process's own cache: another "host"
    world = loader.dataset.world
    out["world"] = [world.rank, world.world_size, world.num_nodes]
    received: list[list[int]] = []

    def xy(batch: dict[str, np.ndarray]) -> tuple[np.ndarray, np.ndarray]:
        received.append([int(i) for i in batch["id"]])
        return batch["x"], batch["y"]

    train = StreamingPyDataset(loader, map_fn=xy)

    def make_model() -> keras.Model:
        # Every process must start from the same weights (JAX checks): seeded initialisers.
        model = keras.Sequential([keras.Input((4,)), keras.layers.Dense(1, kernel_initializer=init(1))])
        model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
        return model

    init = keras.initializers.GlorotUniform
    # Keras refuses a PyDataset under a multi-process distribution that would shard it:
    # the per-process batches are already this process's part.
    keras.distribution.set_distribution(keras.distribution.DataParallel())
    try:
        make_model().fit(train, epochs=1, shuffle=False, verbose=0)
        out["auto_shard_error"] = None
    except ValueError as exc:
        out["auto_shard_error"] = str(exc)
    received.clear()

    keras.distribution.set_distribution(keras.distribution.DataParallel(auto_shard_dataset=False))
    model = make_model()
    trained: list[list[int]] = []

    class Steps(keras.callbacks.Callback):  # type: ignore[misc]
        def on_train_batch_end(self, batch: int, logs: object = None) -> None:
            trained.append([int(i) for i in train.batch_ids(batch)])  # Keras trains batch i at step i

    model.fit(train, epochs=1, shuffle=False, verbose=0, callbacks=[StreamingEpochs(train), Steps()])
    out["planned"] = [ids.tolist() for ids in loader.batch_ids(0)]
    out["received"] = received
    out["trained"] = trained
    out["devices"] = [len(jax.devices()), len(jax.local_devices())]
    out["weights"] = [w.tolist() for w in model.get_weights()]
    loader.dataset.close()
    print(json.dumps(out))
    jax.distributed.shutdown()


if __name__ == "__main__":
    main()
