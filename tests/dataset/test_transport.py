from __future__ import annotations

import multiprocessing as mp
import threading

import numpy as np

from astream._dataset.collate import collate_samples, concat_batches
from astream._dataset.transport import recv_object, send_object


def test_batch_round_trips_through_a_pipe_writable() -> None:
    a, b = mp.Pipe(duplex=False)
    batch = {
        "x": np.arange(3 * 1000, dtype=np.float32).reshape(3, 1000),
        "y": np.array([1, 2, 3]),
        "empty": np.zeros((0, 4), dtype=np.uint8),
        "s": ["a", "bé", ""],
    }
    t = threading.Thread(target=send_object, args=(b, batch))
    t.start()
    got = recv_object(a)
    t.join()
    assert set(got) == set(batch)
    for key in ("x", "y", "empty"):
        np.testing.assert_array_equal(got[key], batch[key])
        assert got[key].dtype == batch[key].dtype
        assert got[key].flags.writeable
    assert got["s"] == batch["s"]


def test_non_contiguous_arrays_survive() -> None:
    a, b = mp.Pipe(duplex=False)
    arr = np.arange(100, dtype=np.int64).reshape(10, 10)[:, ::3]
    t = threading.Thread(target=send_object, args=(b, {"a": arr}))
    t.start()
    got = recv_object(a)
    t.join()
    np.testing.assert_array_equal(got["a"], arr)


def test_collate_stacks_matching_arrays_and_keeps_ragged_as_list() -> None:
    samples = [
        {"x": np.ones((2, 3), np.float32) * i, "r": np.arange(i + 1), "n": i, "s": str(i), "big": 2**70}
        for i in range(4)
    ]
    batch = collate_samples(samples)
    assert isinstance(batch["x"], np.ndarray)
    assert batch["x"].shape == (4, 2, 3)
    assert isinstance(batch["r"], list)
    np.testing.assert_array_equal(batch["n"], [0, 1, 2, 3])
    assert batch["s"] == ["0", "1", "2", "3"]
    assert batch["big"] == [2**70] * 4


def test_concat_batches_joins_arrays_and_lists() -> None:
    a = {"x": np.zeros((2, 3)), "s": ["a", "b"]}
    b = {"x": np.ones((1, 3)), "s": ["c"]}
    out = concat_batches([a, b])
    assert isinstance(out["x"], np.ndarray)
    assert out["x"].shape == (3, 3)
    assert out["s"] == ["a", "b", "c"]
    mixed = concat_batches([{"x": np.zeros((1, 2))}, {"x": np.zeros((1, 3))}])
    assert isinstance(mixed["x"], list)
    assert len(mixed["x"]) == 2
