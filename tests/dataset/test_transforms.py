"""transform=, batch_transform= and subclass overrides are honoured by every path.

Direct iteration (sync and async), Loader without workers, with worker threads and
with worker processes, random access and get_batch: MosaicML's subclass idiom and
astream's transform parameter must never be bypassed silently.
"""

from __future__ import annotations

import asyncio
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from subclasses import Decoded, Pairs, RawHook, add_label, double_x, fail_on_seven

from astream import Loader, MDSWriter, StreamingDataset
from astream.errors import ConfigError, TransformError, WorkerError

N = 60
WORKERS = [(0, "process"), (2, "thread"), (2, "process")]


@pytest.fixture(scope="module")
def remote(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("remote")
    with MDSWriter(out=str(root), columns={"id": "int64", "x": "ndarray:float32:3", "s": "str"},
                   size_limit="1kb") as writer:
        for i in range(N):
            writer.write({"id": i, "x": np.full(3, i, np.float32), "s": f"sample {i}"})
    return root


def _ds(cls: type[StreamingDataset], remote: Path, tmp: Path, **kw: Any) -> StreamingDataset:
    return cls(remote=str(remote), local=str(tmp / "cache"), batch_size=8, shuffle=True, **kw)


def _loader_ids(loader: Loader, key: str = "id") -> list[int]:
    return [int(v) for batch in loader for v in batch[key]]


@pytest.mark.parametrize(("workers", "mode"), WORKERS)
def test_transform_in_every_loader(remote: Path, tmp_path: Path, workers: int, mode: str) -> None:
    ds = _ds(StreamingDataset, remote, tmp_path, transform=add_label)
    try:
        batches = list(Loader(ds, num_workers=workers, worker_mode=mode))
        ids = [int(v) for b in batches for v in b["id"]]
        labels = [int(v) for b in batches for v in b["label"]]
        assert sorted(ids) == list(range(N))
        assert labels == [i * 10 for i in ids]
        assert isinstance(batches[0]["x"], np.ndarray)
        assert batches[0]["x"].shape == (8, 3)  # collated as the vectorised path collates
    finally:
        ds.close()


def test_transform_in_direct_iteration_random_access_and_get_batch(remote: Path, tmp_path: Path) -> None:
    ds = _ds(StreamingDataset, remote, tmp_path, transform=add_label)
    try:
        assert all(s["label"] == int(s["id"]) * 10 for s in ds)
        assert ds[5]["label"] == 50
        assert ds.get_batch([3, 4])["label"].tolist() == [30, 40]

        async def run() -> tuple[list[Any], Any]:
            got = [s async for s in ds]
            one = await ds.aget(9)
            await ds.aclose()
            return got, one

        got, one = asyncio.run(run())
        assert all(s["label"] == int(s["id"]) * 10 for s in got)
        assert one["label"] == 90
    finally:
        ds.close()


@pytest.mark.parametrize(("workers", "mode"), WORKERS)
def test_a_subclass_getitem_is_honoured_by_iteration(remote: Path, tmp_path: Path, workers: int, mode: str) -> None:
    ds = _ds(Decoded, remote, tmp_path)
    try:
        batches = list(Loader(ds, num_workers=workers, worker_mode=mode))
        texts = [t for b in batches for t in b["text"]]
        ids = [int(v) for b in batches for v in b["id"]]
        assert sorted(ids) == list(range(N))
        assert texts == [f"SAMPLE {i}" for i in ids]
        assert "s" not in batches[0]  # the subclass's sample, not the stored one
        direct = list(ds)
        assert [s["text"] for s in direct] == [f"SAMPLE {s['id']}" for s in direct]
        assert ds.get_batch([1, 2])["text"] == ["SAMPLE 1", "SAMPLE 2"]
    finally:
        ds.close()


def test_a_subclass_get_item_is_honoured(remote: Path, tmp_path: Path) -> None:
    ds = _ds(RawHook, remote, tmp_path)
    try:
        assert all(s["hooked"] for s in ds)
        batch = next(iter(Loader(ds, num_workers=2, worker_mode="process")))
        assert batch["hooked"].tolist() == [True] * 8
    finally:
        ds.close()


def test_a_subclass_reading_other_samples(remote: Path, tmp_path: Path) -> None:
    ds = _ds(Pairs, remote, tmp_path)
    try:
        got = list(ds)
        assert [s["next"] for s in got] == [(s["id"] + 1) % N for s in got]
        batches = list(Loader(ds, num_workers=2, worker_mode="thread"))
        assert all(n == (i + 1) % N for b in batches for i, n in zip(b["id"], b["next"], strict=True))
    finally:
        ds.close()


@pytest.mark.parametrize(("workers", "mode"), WORKERS)
def test_batch_transform(remote: Path, tmp_path: Path, workers: int, mode: str) -> None:
    ds = _ds(StreamingDataset, remote, tmp_path)
    try:
        for batch in Loader(ds, num_workers=workers, worker_mode=mode, batch_transform=double_x):
            assert (batch["x"][:, 0] == batch["id"] * 2).all()
    finally:
        ds.close()


def test_a_transform_that_raises_names_the_sample_and_shard(remote: Path, tmp_path: Path) -> None:
    ds = _ds(StreamingDataset, remote, tmp_path, transform=fail_on_seven)
    try:
        with pytest.raises(TransformError, match=r"sample 7 \(record \d+ of shard shard\.\d+\.mds") as info:
            list(ds)
        assert isinstance(info.value.__cause__, ValueError)
        with pytest.raises(TransformError, match="cannot tokenize sample seven"):
            list(Loader(ds))
        with pytest.raises(WorkerError, match=r"TransformError.*sample 7 .*cannot tokenize[\s\S]*worker traceback"):
            list(Loader(ds, num_workers=2, worker_mode="process"))
    finally:
        ds.close()


def test_bad_transforms_are_refused_before_any_work(remote: Path, tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="transform must be a function"):
        _ds(StreamingDataset, remote, tmp_path, transform="upper")
    ds = _ds(StreamingDataset, remote, tmp_path, transform=lambda s: s)
    try:
        with pytest.raises(ConfigError, match=r"transform=.*<lambda>.* cannot be pickled.*worker_mode='thread'"):
            Loader(ds, num_workers=2)
        # Where nothing is pickled a lambda is fine.
        assert len(list(Loader(ds, num_workers=2, worker_mode="thread"))) == N // 8 + 1
        with pytest.raises(ConfigError, match=r"batch_transform=.*cannot be pickled"):
            Loader(ds.__class__(remote=str(remote), local=str(tmp_path / "c2"), batch_size=8),
                   num_workers=1, batch_transform=lambda b: b)
    finally:
        ds.close()
