"""Smoke tests: every example runs as a user would run it, on its own tiny dataset."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parent.parent.parent / "examples"
pytestmark = pytest.mark.slow


def _needs(*modules: str) -> None:
    for module in modules:
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"{module} is not installed")


def _run(*command: str, timeout: float = 150, env: dict[str, str] | None = None) -> str:
    full_env = {**os.environ, "TF_CPP_MIN_LOG_LEVEL": "2", "PYTHON": sys.executable, **(env or {})}
    proc = subprocess.run(command, capture_output=True, text=True, timeout=timeout, env=full_env, check=False)
    assert proc.returncode == 0, f"{' '.join(command)} failed ({proc.returncode}):\n{proc.stdout[-2000:]}\n{proc.stderr[-4000:]}"
    return proc.stdout


def test_async_custom_loop() -> None:
    out = _run(sys.executable, str(EXAMPLES / "async_custom_loop.py"))
    assert "epoch 1:" in out
    assert "steps" in out


def test_async_custom_loop_with_jax() -> None:
    _needs("jax")
    assert "epoch 1:" in _run(sys.executable, str(EXAMPLES / "async_custom_loop.py"), "--jax")


def test_jax_train_on_cpu() -> None:
    _needs("jax")
    out = _run(sys.executable, str(EXAMPLES / "jax_train.py"), env={"JAX_PLATFORMS": "cpu"})
    assert "on cpu" in out


def test_tf_data_pipeline() -> None:
    _needs("tensorflow", "keras")
    out = _run(sys.executable, str(EXAMPLES / "tf_data_pipeline.py"), env={"KERAS_BACKEND": "tensorflow"})
    assert "dtype=tf.string" in out
    assert "accuracy after" in out


def test_keras_fit_resume() -> None:
    _needs("keras", "jax")
    out = _run(sys.executable, str(EXAMPLES / "keras_fit_resume.py"), env={"KERAS_BACKEND": "jax"}, timeout=170)
    assert "run 2 ended with -9" in out
    assert "same batches in the same order: True; same final weights: True" in out


def test_multi_rank() -> None:
    out = _run("bash", str(EXAMPLES / "multi_rank.sh"), timeout=90)
    assert "4 ranks read all 1000 samples, none twice" in out
    assert out.count("rank ") >= 4


def test_curriculum() -> None:
    out = _run(sys.executable, str(EXAMPLES / "curriculum.py"))
    assert "changes at samples [640, 1280]" in out
    assert "no sample repeated" in out
