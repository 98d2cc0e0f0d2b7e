"""A small JAX training loop fed by astream: jitted MLP step, batches prefetched to the device.

    python examples/jax_train.py                 # CPU is fine: a tiny dataset, a few seconds
    python examples/jax_train.py --data DIR      # an MDS dataset with x (float32, 16) and label (int64)

With several processes (``jax.distributed.initialize()``), pass the data sharding to
``device_prefetch`` and each process's batch becomes its slice of one global array.
"""

from __future__ import annotations

import argparse
import tempfile
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh, NamedSharding, PartitionSpec

import astream
from astream.adapters.jax import device_prefetch

FEATURES, CLASSES = 16, 4


def write_dataset(path: Path, samples: int = 4096) -> None:
    """Four Gaussian blobs: label = nearest of four centres."""
    rng = np.random.default_rng(0)
    centres = rng.normal(scale=3.0, size=(CLASSES, FEATURES)).astype(np.float32)
    with astream.MDSWriter(out=str(path), columns={"x": f"ndarray:float32:{FEATURES}", "label": "int64"},
                           compression="zstd", size_limit="64kb") as w:
        for _ in range(samples):
            label = int(rng.integers(CLASSES))
            w.write({"x": centres[label] + rng.normal(size=FEATURES).astype(np.float32), "label": label})


def init(key: Any) -> dict[str, Any]:
    k1, k2 = jax.random.split(key)
    return {"w1": jax.random.normal(k1, (FEATURES, 32)) * 0.1, "b1": jnp.zeros(32),
            "w2": jax.random.normal(k2, (32, CLASSES)) * 0.1, "b2": jnp.zeros(CLASSES)}


def loss_fn(params: dict[str, Any], x: Any, label: Any) -> Any:
    hidden = jax.nn.relu(x @ params["w1"] + params["b1"])
    logits = hidden @ params["w2"] + params["b2"]
    return -jnp.mean(jnp.take_along_axis(jax.nn.log_softmax(logits), label[:, None], axis=1))


@jax.jit
def train_step(params: dict[str, Any], x: Any, label: Any) -> tuple[dict[str, Any], Any]:
    loss, grads = jax.value_and_grad(loss_fn)(params, x, label)
    return jax.tree_util.tree_map(lambda p, g: p - 0.1 * g, params, grads), loss


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, help="an MDS dataset (default: write a tiny one)")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--batch-size", type=int, default=128)
    args = parser.parse_args()
    # Data parallel over this process's devices (one on a plain CPU): batch dim split.
    mesh = Mesh(np.array(jax.devices()), ("data",))
    sharding = NamedSharding(mesh, PartitionSpec("data"))
    with tempfile.TemporaryDirectory() as tmp:
        data = args.data
        if data is None:
            data = Path(tmp) / "ds"
            write_dataset(data)
        ds = astream.StreamingDataset(remote=str(data), local=str(Path(tmp) / "cache"), shuffle=True,
                                      batch_size=args.batch_size)
        loader = astream.Loader(ds, drop_last=True)  # whole batches divide over the devices
        params = init(jax.random.PRNGKey(0))
        losses = []
        for epoch in range(args.epochs):
            for batch in device_prefetch(loader, size=2, sharding=sharding):
                params, loss = train_step(params, batch["x"], batch["label"])
                losses.append(loss)
            print(f"epoch {epoch}: loss {float(losses[-1]):.4f} on {jax.devices()[0].platform}")
        ds.close()
    first, last = float(losses[0]), float(losses[-1])
    print(f"loss {first:.3f} -> {last:.4f} in {len(losses)} steps")
    if not last < first / 2:
        raise SystemExit("the loss did not go down")


if __name__ == "__main__":
    main()
