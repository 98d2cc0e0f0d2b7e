"""``async for`` batches feeding a NumPy (or JAX) training step, with a mid-epoch state.

    python examples/async_custom_loop.py            # writes a tiny dataset in a temp folder
    python examples/async_custom_loop.py --jax      # the step jitted with JAX, batches on device
    python examples/async_custom_loop.py --data DIR # an MDS dataset with x (float32, 8) and y columns

The loader's async iteration runs on the caller's event loop: other coroutines (logging,
evaluation, a checkpoint upload) keep running while batches are read.
"""

from __future__ import annotations

import argparse
import asyncio
import tempfile
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

import astream

TRUE_W = np.linspace(-1.0, 1.0, 8).astype(np.float32)


def write_dataset(path: Path, samples: int = 2048) -> None:
    """y = x @ TRUE_W + noise, in several small shards."""
    rng = np.random.default_rng(0)
    with astream.MDSWriter(out=str(path), columns={"x": "ndarray:float32:8", "y": "float32"}, size_limit="16kb") as w:
        for _ in range(samples):
            x = rng.normal(size=8).astype(np.float32)
            w.write({"x": x, "y": np.float32(x @ TRUE_W + 0.01 * rng.normal())})


def numpy_step(lr: float) -> Callable[[np.ndarray, np.ndarray, np.ndarray], tuple[np.ndarray, float]]:
    def step(w: np.ndarray, x: np.ndarray, y: np.ndarray) -> tuple[np.ndarray, float]:
        err = x @ w - y
        return w - lr * 2 * x.T @ err / len(y), float(np.mean(err**2))

    return step


def jax_step(lr: float) -> Callable[[Any, Any, Any], tuple[Any, float]]:
    import jax
    import jax.numpy as jnp

    @jax.jit
    def step(w: Any, x: Any, y: Any) -> tuple[Any, Any]:
        loss, grad = jax.value_and_grad(lambda w: jnp.mean((x @ w - y) ** 2))(w)
        return w - lr * grad, loss

    def run(w: Any, x: Any, y: Any) -> tuple[Any, float]:
        w, loss = step(w, x, y)
        return w, float(loss)

    return run


async def train(data: Path, cache: Path, use_jax: bool, epochs: int) -> list[float]:
    ds = astream.StreamingDataset(remote=str(data), local=str(cache), shuffle=True, batch_size=64)
    loader = astream.Loader(ds)
    step = jax_step(0.1) if use_jax else numpy_step(0.1)
    w: Any = np.zeros(8, np.float32)
    losses = []
    for epoch in range(epochs):
        batches: Any = loader
        if use_jax:
            from astream.adapters.jax import adevice_prefetch

            batches = adevice_prefetch(loader, size=2)  # copies overlap the step
        async for batch in batches:
            w, loss = step(w, batch["x"], batch["y"])
            losses.append(loss)
        state = loader.state_dict()
        print(f"epoch {epoch}: loss {losses[-1]:.5f}, state {state['epoch']}/{state['sample_in_epoch']}")
    await ds.aclose()
    return losses


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--data", type=Path, help="an MDS dataset (default: write a tiny one)")
    parser.add_argument("--jax", action="store_true", help="jit the step with JAX")
    parser.add_argument("--epochs", type=int, default=2)
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        data = args.data
        if data is None:
            data = Path(tmp) / "ds"
            write_dataset(data)
        losses = asyncio.run(train(data, Path(tmp) / "cache", args.jax, args.epochs))
    print(f"loss {losses[0]:.4f} -> {losses[-1]:.5f} in {len(losses)} steps")
    if not losses[-1] < losses[0] / 10:
        raise SystemExit("the loss did not go down")


if __name__ == "__main__":
    main()
