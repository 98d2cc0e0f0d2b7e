"""Acceptance: Keras (JAX and TensorFlow backends), tf.data and JAX device prefetch, on real training runs.

Each backend runs once, in a fresh interpreter (``framework_job.py``: the Keras backend
is fixed at keras' first import), and the tests below judge what it observed.
"""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from adapterkit import HERE, SAMPLES, run_job, write_dataset

from astream.testing import free_port

pytestmark = pytest.mark.slow


@pytest.fixture(scope="module")
def run_backend(tmp_path_factory: pytest.TempPathFactory) -> Callable[[str], dict[str, Any]]:
    """Runs each backend's job once per module, however many tests read it."""
    done: dict[str, dict[str, Any]] = {}

    def run(backend: str) -> dict[str, Any]:
        for module in ("keras", backend):
            if importlib.util.find_spec(module) is None:
                pytest.skip(f"{module} is not installed")
        if backend not in done:
            env = {"KERAS_BACKEND": backend}
            if backend == "jax":
                env["XLA_FLAGS"] = "--xla_force_host_platform_device_count=2"  # two CPU devices to shard over
            done[backend] = run_job("framework_job.py", str(tmp_path_factory.mktemp(backend)), env=env)
        return done[backend]

    return run


@pytest.fixture(params=["jax", "tensorflow"])
def job(request: pytest.FixtureRequest, run_backend: Callable[[str], dict[str, Any]]) -> dict[str, Any]:
    return run_backend(request.param)


@pytest.fixture
def tf_job(run_backend: Callable[[str], dict[str, Any]]) -> dict[str, Any]:
    return run_backend("tensorflow")


@pytest.fixture
def jax_job(run_backend: Callable[[str], dict[str, Any]]) -> dict[str, Any]:
    return run_backend("jax")


def _weights_equal(a: list[Any], b: list[Any]) -> bool:
    return len(a) == len(b) and all(np.array_equal(np.asarray(x), np.asarray(y)) for x, y in zip(a, b, strict=True))


# -- Keras ---------------------------------------------------------------------------------


def test_fit_two_epochs_trains_on_the_loaders_batches(job: dict[str, Any]) -> None:
    epochs = job["loader_epochs"]
    assert len(job["full"]) == 2 * job["batches_per_epoch"] == sum(len(e) for e in epochs)
    # The batches Keras trained on are the loader's, epoch after epoch, in its order.
    assert job["full"] == epochs[0] + epochs[1]
    assert job["full_received"] == job["full"]
    assert epochs[0] != epochs[1]  # a shuffled dataset reshuffles each epoch
    assert sorted(i for b in epochs[0] for i in b) == list(range(100))
    assert job["losses"][1] < job["losses"][0]


def test_resume_after_one_and_a_half_epochs_sees_exactly_the_uninterrupted_samples(job: dict[str, Any]) -> None:
    per_epoch = job["batches_per_epoch"]
    assert job["stopped_at"] == per_epoch + per_epoch // 2
    steps = job["checkpoint_steps"]
    assert per_epoch < steps < job["stopped_at"]  # the last checkpoint is mid-epoch, before the stop
    assert job["initial_epoch"] == 1
    # Trained up to the checkpoint, then the resumed run: the uninterrupted sequence, in order.
    assert job["first"][:steps] + job["resumed"] == job["full"]
    # And the model agrees to the last bit: same batches, same order, same optimizer state.
    assert _weights_equal(job["resumed_weights"], job["full_weights"])


def test_keras_reader_threads_read_only_the_epochs_batches(job: dict[str, Any]) -> None:
    # Whatever order Keras' threads ask in, batch i is batch i. (Keras 3.15's threaded
    # OrderedEnqueuer itself may hand a stale batch over after a restart, so the trained
    # order, and so the weights, are not compared here: see docs/frameworks/keras.md.)
    batches = {tuple(sorted(b)) for b in job["full"]}
    assert {tuple(b) for b in job["threaded"]} <= batches
    assert len(job["threaded"]) >= len(job["full"])


def test_without_a_callback_epochs_still_follow_fit(job: dict[str, Any]) -> None:
    assert _weights_equal(job["bare_weights"], job["full_weights"])


def test_fit_shuffle_is_refused_with_a_clear_message(job: dict[str, Any]) -> None:
    assert job["shuffle_error"] is not None
    assert "shuffle=False" in job["shuffle_error"]


# -- tf.data -------------------------------------------------------------------------------


def test_tf_element_spec_follows_the_columns(tf_job: dict[str, Any]) -> None:
    assert tf_job["tf_spec"] == {"x": ["float32", [None, 4]], "y": ["float32", [None]],
                                 "id": ["int64", [None]], "s": ["string", [None]]}
    # drop_last=True makes the batch dimension static.
    assert tf_job["tf_fit_spec"] == [["float32", [8, 4]], ["float32", [8]]]
    assert tf_job["tf_cardinality"] == tf_job["batches_per_epoch"]


def test_tf_string_column_arrives_as_tf_string(tf_job: dict[str, Any]) -> None:
    first = tf_job["tf_first"]
    assert first["s_dtype"] == "string"
    assert first["s"] == [f"sample {i}" for i in first["id"][:3]]
    assert first["x_shape"] == [8, 4]


def test_tf_model_fit_trains_on_the_loaders_batches(tf_job: dict[str, Any]) -> None:
    losses = tf_job["tf_losses"]
    assert len(losses) == 3
    assert losses[-1] < losses[0]
    assert tf_job["tf_ids"] == tf_job["loader_epochs"][0]
    assert tf_job["tf_last_epoch"] == 2  # three Keras epochs, three loader epochs: none skipped


def test_tf_pass_of_two_epochs_keeps_the_loaders_order(tf_job: dict[str, Any]) -> None:
    epochs = tf_job["loader_epochs"]
    assert tf_job["tf_two_epochs"] == epochs[0] + epochs[1]
    assert tf_job["tf_two_cardinality"] == 2 * tf_job["batches_per_epoch"]


def test_tf_endless_stream_resumes_mid_epoch(tf_job: dict[str, Any]) -> None:
    epochs = tf_job["loader_epochs"]
    assert tf_job["tf_endless_cardinality"] == -1  # tf.data.INFINITE_CARDINALITY
    # The rest of the epoch after 5 batches, then the next epoch, unchanged.
    assert tf_job["tf_resumed"] == epochs[0][5:] + epochs[1]


def test_tf_output_signature_passes_collated_batches(tf_job: dict[str, Any]) -> None:
    assert tf_job["tf_collated"] == tf_job["loader_epochs"][0]
    error = tf_job["tf_wrong_shape_error"]
    assert error is not None
    assert "does not fit the element spec" in error


# -- JAX -----------------------------------------------------------------------------------


def test_device_prefetch_yields_arrays_on_the_device(jax_job: dict[str, Any]) -> None:
    assert jax_job["jax_on_device"] is True
    assert jax_job["jax_types"] == ["ArrayImpl", "list"]  # numbers on the device, text stays a list
    assert jax_job["jax_batches"] == jax_job["loader_epochs"][0]
    assert jax_job["jax_x_shape"] == [8, 4]


def test_device_prefetch_shards_over_devices(jax_job: dict[str, Any]) -> None:
    assert jax_job["jax_devices"] == 2
    assert jax_job["jax_shards"] == [[4, 4], [4, 4]]
    assert jax_job["jax_sharding_ok"] is True


def test_async_device_prefetch_stops_early(jax_job: dict[str, Any]) -> None:
    assert jax_job["jax_async"] == jax_job["loader_epochs"][0][:2]


def test_device_prefetch_makes_one_global_array_of_the_processes_batches(tmp_path: Path) -> None:
    """Two jax.distributed processes (two CPU devices each) and two astream ranks."""
    if importlib.util.find_spec("jax") is None:
        pytest.skip("jax is not installed")
    data = write_dataset(tmp_path / "ds")
    port = str(free_port())
    procs = []
    for rank in range(2):
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": "2",
               "ASTREAM_RUN_ID": f"dist-{port}", "PYTHONPATH": str(HERE), "JAX_PLATFORMS": "cpu",
               "XLA_FLAGS": "--xla_force_host_platform_device_count=2", "TF_CPP_MIN_LOG_LEVEL": "2"}
        procs.append(subprocess.Popen([sys.executable, str(HERE / "jax_dist_job.py"), str(rank), port, str(data),
                                       str(tmp_path / "cache")], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                      text=True, env=env))
    outs = []
    for proc in procs:
        stdout, stderr = proc.communicate(timeout=120)
        assert proc.returncode == 0, stderr[-3000:]
        outs.append(json.loads(stdout.strip().splitlines()[-1]))
    per_rank = len(outs[0]["local"][0])
    for out in outs:
        assert (out["devices"], out["local_devices"]) == (4, 2)
        assert out["global_shapes"] == [[2 * per_rank]] * len(out["local"])
        for local, shards in zip(out["local"], out["shards"], strict=True):
            # This process holds its own batch, split over its two devices, at its rank's offset.
            starts = sorted(start for _, start, _ in shards)
            assert starts == [out["process"] * per_rank, out["process"] * per_rank + per_rank // 2]
            assert [i for _, _, part in sorted(shards, key=lambda s: s[1]) for i in part] == local
    ids = [i for out in outs for batch in out["local"] for i in batch]
    assert len(ids) == len(set(ids))  # the ranks' batches are disjoint parts of the epoch


@pytest.mark.slow
def test_keras_data_parallel_over_two_processes_trains_each_process_on_its_own_batches(tmp_path: Path) -> None:
    """Keras 3 multi-process (JAX backend): ``jax.distributed`` gives astream its world, each
    process's StreamingPyDataset yields that process's batches, DataParallel
    (``auto_shard_dataset=False``) joins them, and together they cover the epoch once."""
    for module in ("jax", "keras"):
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"{module} is not installed")
    data = write_dataset(tmp_path / "ds")
    port = str(free_port())
    env = {k: v for k, v in os.environ.items() if k not in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")}
    env.update({"PYTHONPATH": os.pathsep.join([str(HERE), os.environ.get("PYTHONPATH", "")]), "JAX_PLATFORMS": "cpu",
                "TF_CPP_MIN_LOG_LEVEL": "2"})
    env.pop("XLA_FLAGS", None)  # one CPU device per process
    procs = [subprocess.Popen([sys.executable, str(HERE / "keras_dist_job.py"), str(process), port, str(data),
                               str(tmp_path / f"cache{process}")], stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                              text=True, env=env) for process in range(2)]
    outs = []
    for proc in procs:
        stdout, stderr = proc.communicate(timeout=120)
        assert proc.returncode == 0, stderr[-3000:]
        outs.append(json.loads(stdout.strip().splitlines()[-1]))
    for out in outs:
        assert out["world"] == [out["process"], 2, 2]  # from jax.distributed: one process per host
        assert out["devices"] == [2, 1]
        assert "auto_shard_dataset = False" in out["auto_shard_error"]
        assert out["trained"] == out["planned"]  # this process's batches, in the loader's order
        assert {tuple(b) for b in out["received"]} == {tuple(b) for b in out["planned"]}
    assert len(outs[0]["trained"]) == len(outs[1]["trained"])  # one global step per pair of batches
    ids = sorted(i for out in outs for batch in out["trained"] for i in batch)
    assert ids == list(range(SAMPLES))  # disjoint, and the whole epoch exactly once
    assert outs[0]["weights"] == outs[1]["weights"]  # one model, trained on the global batches
