"""Shared by the adapter tests and their subprocess jobs: a tiny dataset, a loader, a job runner."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np

import astream

BATCH = 8
SAMPLES = 100
COLUMNS = {"x": "ndarray:float32:4", "y": "float32", "id": "int64", "s": "str"}
HERE = Path(__file__).resolve().parent


def write_dataset(path: Path, samples: int = SAMPLES) -> Path:
    """A linear-regression dataset with an id and a text column, in several small shards."""
    rng = np.random.default_rng(0)
    w = np.array([1.0, -2.0, 0.5, 3.0], np.float32)
    with astream.MDSWriter(out=str(path), columns=COLUMNS, size_limit=600) as out:
        for i in range(samples):
            x = rng.normal(size=4).astype(np.float32)
            out.write({"x": x, "y": np.float32(x @ w), "id": i, "s": f"sample {i}"})
    return path


def make_loader(data: Path, cache: Path, **kwargs: Any) -> astream.Loader:
    """A shuffled loader over ``data`` with its own cache folder."""
    ds = astream.StreamingDataset(remote=str(data), local=str(cache), shuffle=True, shuffle_seed=7, batch_size=BATCH)
    return astream.Loader(ds, **kwargs)


def run_job(script: str, *args: str, env: dict[str, str] | None = None, timeout: float = 150) -> dict[str, Any]:
    """Run ``tests/adapters/<script>`` in a fresh interpreter; return the JSON it prints last."""
    # PYTHONFAULTHANDLER: a crash in native code (seen once: -11 in the JAX job, at load 4-5)
    # prints every thread's Python stack into the stderr the failure shows.
    full_env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHONFAULTHANDLER": "1", "PYTHONPATH": str(HERE),
                **(env or {})}
    proc = subprocess.run([sys.executable, str(HERE / script), *args], capture_output=True, text=True,
                          env=full_env, timeout=timeout, check=False)
    if proc.returncode != 0:
        raise AssertionError(f"{script} {' '.join(args)} failed ({proc.returncode}):\n{proc.stderr[-4000:]}")
    return dict(json.loads(proc.stdout.strip().splitlines()[-1]))

