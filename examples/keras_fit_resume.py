"""Keras ``fit``, killed mid-epoch, resumed from its checkpoint: the same samples, in order.

    python examples/keras_fit_resume.py        # the whole demo, in three processes

1. an uninterrupted run of 3 epochs logs the ids of every batch it trains on;
2. a second run checkpoints every 5 batches and is killed (SIGKILL) in epoch 2;
3. a third process restores the checkpoint and fits on.

The demo then checks that run 2 up to its checkpoint followed by run 3 trained on
exactly the batches of run 1, in the same order (and ends with the same weights).
Runs on the JAX backend by default (``KERAS_BACKEND`` picks another).

    python examples/keras_fit_resume.py --phase train --workdir DIR [--kill-at N]   # one run
"""

from __future__ import annotations

import argparse
import json
import os
import signal
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

os.environ.setdefault("KERAS_BACKEND", "jax")
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import numpy as np

import astream

EPOCHS = 3


def write_dataset(path: Path, samples: int = 480) -> None:
    rng = np.random.default_rng(0)
    w = rng.normal(size=6).astype(np.float32)
    with astream.MDSWriter(out=str(path), columns={"x": "ndarray:float32:6", "y": "float32", "id": "int64"},
                           size_limit="4kb") as out:
        for i in range(samples):
            x = rng.normal(size=6).astype(np.float32)
            out.write({"x": x, "y": np.float32(np.tanh(x @ w)), "id": i})


def train(workdir: Path, name: str, kill_at: int | None) -> None:
    """One process: fit (resuming from ``workdir/name`` when a checkpoint is there)."""
    import keras

    from astream.adapters.keras import StreamingCheckpoint, StreamingPyDataset

    ds = astream.StreamingDataset(remote=str(workdir / "ds"), local=str(workdir / f"cache-{name}"),
                                  shuffle=True, batch_size=16)
    train_data = StreamingPyDataset(astream.Loader(ds), x="x", y="y")
    ckpt = StreamingCheckpoint(train_data, workdir / name, save_freq=5)
    initial_epoch = ckpt.restore()
    if ckpt.latest() is not None:
        model = keras.saving.load_model(ckpt.model_path)
        print(f"resuming at epoch {initial_epoch}, after {ckpt.steps} batches", flush=True)
    else:
        init = keras.initializers.GlorotUniform
        model = keras.Sequential([keras.Input((6,)), keras.layers.Dense(16, activation="tanh", kernel_initializer=init(1)),
                                  keras.layers.Dense(1, kernel_initializer=init(2))])
        model.compile(optimizer=keras.optimizers.SGD(0.05), loss="mse")
    log = (workdir / f"{name}.jsonl").open("a")
    log.write(json.dumps({"start": ckpt.steps}) + "\n")

    class Log(keras.callbacks.Callback):  # type: ignore[misc]
        def on_train_batch_end(self, batch: int, logs: Any = None) -> None:
            log.write(json.dumps({"ids": train_data.batch_ids(batch).tolist()}) + "\n")
            log.flush()
            if kill_at is not None and ckpt.steps == kill_at:
                os.kill(os.getpid(), signal.SIGKILL)  # no cleanup, no goodbye: a crash

    # shuffle=False: astream shuffles the samples; Keras' batch shuffling would not resume.
    model.fit(train_data, epochs=EPOCHS, initial_epoch=initial_epoch, shuffle=False, verbose=0,
              callbacks=[ckpt, Log()])  # ckpt first: it counts the batch before Log reads the count
    log.close()
    np.savez(workdir / f"{name}-weights.npz", *model.get_weights())


def trained(log: Path) -> list[list[int]]:
    """The batches a run trained on, replaying restarts: a restart rewinds to its checkpoint."""
    batches: list[list[int]] = []
    for line in log.read_text().splitlines():
        entry = json.loads(line)
        if "start" in entry:
            del batches[entry["start"]:]
        else:
            batches.append(entry["ids"])
    return batches


def demo() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        write_dataset(workdir / "ds")
        me = [sys.executable, __file__, "--phase", "train", "--workdir", tmp]
        subprocess.run([*me, "--name", "full"], check=True)
        killed = subprocess.run([*me, "--name", "run", "--kill-at", "53"], check=False)  # 53: in epoch 2 of 30-batch epochs
        print(f"run 2 ended with {killed.returncode} (-9: killed)")
        subprocess.run([*me, "--name", "run"], check=True)
        full, resumed = trained(workdir / "full.jsonl"), trained(workdir / "run.jsonl")
        same_weights = all(np.array_equal(a, b) for a, b in zip(
            np.load(workdir / "full-weights.npz").values(), np.load(workdir / "run-weights.npz").values(), strict=True))
        print(f"uninterrupted: {len(full)} batches; killed + resumed: {len(resumed)} batches")
        print(f"same batches in the same order: {full == resumed}; same final weights: {same_weights}")
        if killed.returncode != -signal.SIGKILL or full != resumed or not same_weights:
            raise SystemExit("the resumed run differs from the uninterrupted one")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--phase", choices=["demo", "train"], default="demo")
    parser.add_argument("--workdir", type=Path)
    parser.add_argument("--name", default="run")
    parser.add_argument("--kill-at", type=int, help="SIGKILL this process after this many batches")
    args = parser.parse_args()
    if args.phase == "demo":
        demo()
    else:
        train(args.workdir, args.name, args.kill_at)


if __name__ == "__main__":
    main()
