"""Batches decoded ahead (``astream._dataset.read.ahead``) equal the batches read one by one.

Every MDS column type (those decoded ahead in one layout of variable-size records, those
never decoded ahead in another), and layouts of fixed-size records (several columns, and
one column whose rows are the column itself); shuffled and
not, ``drop_last``, several simulated ranks and worker threads: each batch must equal
the one the per-batch path gives (the same run with decoding ahead turned off), value
for value, with the same dtypes, shapes and element types. Worker processes, which the
switch cannot reach, are compared with ``LocalDataset.get_batch`` of each batch's ids
(the per-batch gather). A spy checks that the windows were used at all.
"""

from __future__ import annotations

import asyncio
import io
import itertools
import math
from dataclasses import replace
from decimal import Decimal
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from helpers import close_all, make_rank_datasets
from hypothesis import HealthCheck, given, note, settings
from hypothesis import strategies as st

import astream._dataset.read.assembly as reader_module  # (where the reader assembles batches)
from astream import LocalDataset, MDSWriter, StreamingDataset
from astream._dataset import tuning
from astream._dataset.loader import Loader
from astream.errors import EncodingError

NUMERIC = ["uint8", "uint16", "uint32", "uint64", "int8", "int16", "int32", "int64", "float16", "float32", "float64"]
# Every encoding that is decoded ahead, in records with variable-size columns...
VARIABLE = {
    "id": "int64", "b": "bytes", "s": "str", "n": "int", "si": "str_int", "sf": "str_float", "sd": "str_decimal",
    "nd": "ndarray", "ndf": "ndarray:float32", "ndx": "ndarray:int16:2,3", **{f"c_{name}": name for name in NUMERIC},
}
# ... and every one that is not (its decoding dwarfs a shard's fixed cost).
RICH = {
    "id": "int64", "s": "str", "js": "json", "pk": "pkl", "pil": "pil", "png": "png", "jpg": "jpeg",
    "lpil": "list[pil]", "lpng": "list[png]", "ljpg": "list[jpeg]", "ja": "jpeg_array",
}
FIXED = {"id": "int64", "n": "int", "x": "ndarray:int32:3", "h": "float16", "u": "uint8"}
OTHER = {**FIXED, "x": "ndarray:int16:3"}  # the same names, another encoding
ONE = {"id": "ndarray:uint8:16"}  # one column: a batch's rows are its values (views, unless copied)
SAMPLES = 150


def _image(rng: np.random.Generator, mode: str) -> Any:
    from PIL import Image

    size = (int(rng.integers(1, 5)), int(rng.integers(1, 5)))
    nbytes = len(Image.new(mode, size).tobytes())
    return Image.frombytes(mode, size, rng.integers(0, 256, nbytes, np.uint8).tobytes())


def _jpeg(rng: np.random.Generator) -> bytes:
    out = io.BytesIO()
    _image(rng, "RGB").save(out, format="JPEG")
    return out.getvalue()


def _value(spec: str, i: int, rng: np.random.Generator) -> Any:
    if spec in NUMERIC:
        info = np.iinfo(spec) if spec[0] in "ui" else None
        return int(rng.integers(0, 2**63)) % (int(info.max) + 1) if info else float(rng.normal() * 1e3)
    return {
        "bytes": lambda: rng.bytes(int(rng.integers(0, 40))),
        "str": lambda: "é" * int(rng.integers(0, 9)) + str(i),
        "int": lambda: int(rng.integers(-(2**62), 2**62)),
        "str_int": lambda: int(rng.integers(-(2**62), 2**62)) * 10**20,
        "str_float": lambda: float(rng.normal()),
        "str_decimal": lambda: Decimal(int(rng.integers(0, 10**6))).scaleb(-3),
        "json": lambda: {"i": i, "l": [1.5, None, "x" * (i % 4)]},
        "pkl": lambda: (i, frozenset({i, i + 1}), b"p" * (i % 3)),
        "pil": lambda: _image(rng, ["L", "RGB", "RGBA", "I;16"][i % 4]),
        "png": lambda: _image(rng, ["L", "RGB", "RGBA"][i % 3]),
        "jpeg": lambda: _image(rng, "RGB"),
        "list[pil]": lambda: [_image(rng, "L") for _ in range(i % 3)],
        "list[png]": lambda: [_image(rng, "RGB") for _ in range(i % 2 + 1)],
        "list[jpeg]": lambda: [_image(rng, "L") for _ in range(i % 2)],
        "jpeg_array": lambda: [_jpeg(rng) for _ in range(i % 2 + 1)],
        "ndarray": lambda: rng.integers(0, 100, (i % 3 + 1, 2)).astype(["int8", "float64", "uint16"][i % 3]),
        "ndarray:float32": lambda: rng.normal(size=i % 5 + 1).astype(np.float32),
        "ndarray:int16:2,3": lambda: rng.integers(-99, 99, (2, 3)).astype(np.int16),
        "ndarray:int32:3": lambda: rng.integers(-99, 99, 3).astype(np.int32),
        "ndarray:int16:3": lambda: rng.integers(-99, 99, 3).astype(np.int16),
        "ndarray:uint8:16": lambda: np.full(16, i % 251, np.uint8),
    }[spec]()


@pytest.fixture(scope="module")
def layouts(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("ahead")
    rng = np.random.default_rng(5)
    for name, columns, limit in (("var", VARIABLE, 5_000), ("rich", RICH, 40_000), ("fixed", FIXED, 700),
                                  ("other", OTHER, 700), ("one", ONE, 300)):
        with MDSWriter(out=str(root / name), columns=columns, size_limit=limit) as w:
            for i in range(SAMPLES):  # many small shards: a shuffled batch spans several
                sample = {k: _value(spec, i, rng) for k, spec in columns.items() if k != "id"}
                w.write({"id": np.full(16, i % 251, np.uint8) if name == "one" else i, **sample})
    return root


def _same_value(got: Any, want: Any) -> bool:
    if type(got) is not type(want):
        return False
    if isinstance(want, np.ndarray):
        return got.dtype == want.dtype and got.shape == want.shape and got.tobytes() == want.tobytes()
    if isinstance(want, np.generic):
        return got.dtype == want.dtype and got.tobytes() == want.tobytes()
    if isinstance(want, float):
        return got == want or (math.isnan(got) and math.isnan(want))
    if isinstance(want, (list, tuple)):
        return len(got) == len(want) and all(_same_value(g, w) for g, w in zip(got, want, strict=True))
    if hasattr(want, "tobytes") and hasattr(want, "mode"):  # a PIL image
        return (got.mode, got.size, got.tobytes()) == (want.mode, want.size, want.tobytes())
    return bool(got == want)


def assert_same_batch(got: dict[str, Any], want: dict[str, Any], where: str) -> None:
    assert list(got) == list(want), where
    for name in want:
        g, w = got[name], want[name]
        assert type(g) is type(w), f"{where}, column {name}: {type(g).__name__} vs {type(w).__name__}"
        if isinstance(w, np.ndarray):
            assert (g.dtype, g.shape) == (w.dtype, w.shape), f"{where}, column {name}"
            assert g.flags.writeable, f"{where}, column {name}"
            assert g.flags.c_contiguous == w.flags.c_contiguous, f"{where}, column {name}"
        assert _same_value(g, w), f"{where}, column {name}: values differ"


class Spy:
    """Counts the windows the readers decoded ahead (in this process's threads)."""

    def __init__(self, monkeypatch: pytest.MonkeyPatch) -> None:
        self.calls = self.windows = 0
        real = reader_module.decode_ahead

        def spy(*args: Any) -> Any:
            out = real(*args)
            self.calls += 1
            self.windows += out is not None
            return out

        monkeypatch.setattr(reader_module, "decode_ahead", spy)


_runs = itertools.count()


def _iterate(layouts: Path, tmp: Path, layout: str, ranks: int, workers: int, batch: int, drop_last: bool,
             shuffle: bool, epochs: int, **kwargs: Any) -> list[list[dict[str, Any]]]:
    name = f"run{next(_runs)}"
    datasets = make_rank_datasets(
        [{"layout": layout}], layouts, tmp / name, {"num_physical_nodes": 1, "ranks_per_node": ranks},
        run_id=name, batch_size=batch, shuffle=shuffle, allow_unsafe_types=True, **kwargs,
    )
    loaders = [Loader(ds, num_workers=workers, worker_mode="thread", drop_last=drop_last) for ds in datasets]

    async def one(loader: Loader) -> list[dict[str, Any]]:
        return [batch for _ in range(epochs) async for batch in loader]

    async def go() -> list[list[dict[str, Any]]]:
        try:
            return list(await asyncio.gather(*(one(loader) for loader in loaders)))
        finally:
            await close_all(datasets)

    return list(asyncio.run(go()))


@settings(max_examples=10, suppress_health_check=[HealthCheck.function_scoped_fixture], deadline=None)
@given(
    layout=st.sampled_from(["var", "fixed", "one", "rich"]),
    ranks=st.integers(1, 3),
    workers=st.integers(0, 2),
    batch=st.integers(2, 9),
    drop_last=st.booleans(),
    shuffle=st.booleans(),
    algo=st.sampled_from(["py1e", "py1s", "py1br", "naive"]),
    predownload=st.sampled_from([None, SAMPLES]),
)
def test_batches_decoded_ahead_equal_the_batches_read_one_by_one(
    layouts: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, layout: str, ranks: int, workers: int,
    batch: int, drop_last: bool, shuffle: bool, algo: str, predownload: int | None,
) -> None:
    config = {"ranks": ranks, "workers": workers, "batch": batch, "drop_last": drop_last, "shuffle": shuffle,
              "epochs": 2, "shuffle_algo": algo, "predownload": predownload}
    with monkeypatch.context() as off:
        off.setattr(tuning, "READ_AHEAD", replace(tuning.READ_AHEAD, ahead_bytes=0))  # no window fits: the per-batch path
        want = _iterate(layouts, tmp_path, layout, **config)
    with monkeypatch.context() as on:  # (one spy per example, not one around the last)
        spy = Spy(on)
        got = _iterate(layouts, tmp_path, layout, **config)
    assert [len(b) for b in got] == [len(b) for b in want]
    for rank, (g_batches, w_batches) in enumerate(zip(got, want, strict=True)):
        for k, (g, w) in enumerate(zip(g_batches, w_batches, strict=True)):
            assert_same_batch(g, w, f"rank {rank}, batch {k} ({config})")
    note(f"windows decoded ahead: {spy.windows}")  # (that some are is test_windows_are_used's)


@pytest.mark.parametrize(("layout", "shuffle"), [("var", True), ("fixed", True), ("one", True), ("var", False)])
def test_windows_are_used(layouts: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, layout: str,
                          shuffle: bool) -> None:
    """A shuffled epoch over shards of 4-25 records is read through windows, and so is an
    unshuffled one of variable-size records (so the equality above compares the two
    paths); each batch equals the per-batch gather."""
    spy = Spy(monkeypatch)
    # (Look-ahead over all the shards: a window never reaches past the leases requested.)
    ds = StreamingDataset(local=str(layouts / layout), batch_size=8, shuffle=shuffle, allow_unsafe_types=True,
                          predownload=SAMPLES)
    local = LocalDataset(str(layouts / layout), allow_unsafe_types=True)
    with Loader(ds, batch_size=8) as loader:
        got = list(loader)
        ids = loader.batch_ids(0)
    ds.close()
    assert spy.windows >= 2  # the first window, then a longer one
    assert len(got) == len(ids)
    for k, (batch, batch_ids) in enumerate(zip(got, ids, strict=True)):
        assert_same_batch(batch, local.get_batch(batch_ids), f"batch {k}")
    local.close()


def test_costly_encodings_are_read_batch_by_batch(layouts: Path, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    """Images, JSON, pickles: their decoding dwarfs a shard's fixed cost, and a window of
    them would hold the loop's thread; nothing is decoded ahead."""
    spy = Spy(monkeypatch)
    ds = StreamingDataset(local=str(layouts / "rich"), batch_size=8, shuffle=True, allow_unsafe_types=True,
                          predownload=SAMPLES)
    local = LocalDataset(str(layouts / "rich"), allow_unsafe_types=True)
    with Loader(ds, batch_size=8) as loader:
        got = list(loader)
        ids = loader.batch_ids(0)
    ds.close()
    assert spy.calls > 0
    assert spy.windows == 0
    for k, (batch, batch_ids) in enumerate(zip(got, ids, strict=True)):
        assert_same_batch(batch, local.get_batch(batch_ids), f"batch {k}")
    local.close()


def test_streams_of_other_encodings_are_read_batch_by_batch(layouts: Path, tmp_path: Path,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    """Two streams whose encodings differ: a window would mix layouts, so none is decoded."""
    from astream import Stream

    def read() -> list[dict[str, Any]]:
        streams = [Stream(local=str(layouts / "fixed")), Stream(local=str(layouts / "other"))]
        ds = StreamingDataset(streams=streams, batch_size=6, shuffle=True, predownload=2 * SAMPLES)
        with Loader(ds, batch_size=6) as loader:
            batches = list(loader)
        ds.close()
        return batches

    with monkeypatch.context() as off:
        off.setattr(tuning, "READ_AHEAD", replace(tuning.READ_AHEAD, ahead_bytes=0))
        want = read()
    spy = Spy(monkeypatch)
    got = read()
    assert spy.calls > 0
    assert spy.windows == 0
    assert len(got) == len(want)
    for k, (g, w) in enumerate(zip(got, want, strict=True)):
        assert_same_batch(g, w, f"batch {k}")


def test_worker_processes_give_the_per_batch_gather(layouts: Path, tmp_path: Path) -> None:
    layout = "var"  # (fixed-size rows take the same path in a process as in a thread, tested above)
    ds = StreamingDataset(local=str(layouts / layout), batch_size=8, shuffle=True, predownload=SAMPLES)
    local = LocalDataset(str(layouts / layout))
    with Loader(ds, batch_size=8, num_workers=2, drop_last=False) as loader:
        got = list(loader)
        ids = loader.batch_ids(0)
    ds.close()
    assert len(got) == len(ids)
    for k, (batch, batch_ids) in enumerate(zip(got, ids, strict=True)):
        assert_same_batch(batch, local.get_batch(batch_ids), f"batch {k}")
    local.close()


@pytest.mark.parametrize(("shuffle", "batch"), [(True, 8), (False, 5)])
def test_a_bounded_cache_decodes_nothing_ahead(layouts: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
                                               shuffle: bool, batch: int) -> None:
    """With a cache_limit a reader pins only its current batch, and decodes only that.

    (Unshuffled batches of 5 from shards of 12 records: a shard's lease holds the next
    batches too, so only the rule, not the leases, keeps windows out.)
    """
    spy = Spy(monkeypatch)
    ds = StreamingDataset(remote=str(layouts / "fixed"), local=str(tmp_path / "cache"), batch_size=batch,
                          shuffle=shuffle, cache_limit=20_000, predownload=SAMPLES)
    local = LocalDataset(str(layouts / "fixed"))
    with Loader(ds, batch_size=batch) as loader:
        got = list(loader)
        ids = loader.batch_ids(0)
    ds.close()
    assert spy.calls == 0
    for k, (batch_got, batch_ids) in enumerate(zip(got, ids, strict=True)):
        assert_same_batch(batch_got, local.get_batch(batch_ids), f"batch {k}")
    local.close()


def test_large_records_are_read_batch_by_batch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Records of 8 KB: beside them a shard's fixed cost is small, and their decoded values
    would hold the window's memory; nothing is decoded ahead."""
    root = tmp_path / "ds"
    with MDSWriter(out=str(root), columns={"id": "int", "b": "bytes"}, size_limit=40_000) as w:
        for i in range(60):
            w.write({"id": i, "b": bytes([i]) * 8000})
    spy = Spy(monkeypatch)
    ds = StreamingDataset(local=str(root), batch_size=4, shuffle=True, predownload=60)
    local = LocalDataset(str(root))
    with Loader(ds, batch_size=4) as loader:
        got = list(loader)
        ids = loader.batch_ids(0)
    ds.close()
    assert spy.calls == 0
    for k, (batch, batch_ids) in enumerate(zip(got, ids, strict=True)):
        assert_same_batch(batch, local.get_batch(batch_ids), f"batch {k}")
    local.close()


def test_a_corrupt_record_fails_with_its_own_batch(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A record that does not decode, in a window's later batch: the batches before it
    are still yielded, and the error names it when its batch comes, as batch by batch."""
    root = tmp_path / "ds"
    with MDSWriter(out=str(root), columns={"id": "int", "s": "str"}, size_limit=300) as w:
        for i in range(200):
            w.write({"id": i, "s": f"text-{i:04d}"})
    shard = root / "shard.00002.mds"
    data = shard.read_bytes()
    at = data.index(b"text-")
    shard.write_bytes(data[:at] + b"\xff" + data[at + 1 :])  # invalid UTF-8 in one record of shard 2

    def read(ahead: bool) -> tuple[int, str]:
        with monkeypatch.context() as m:
            if not ahead:
                m.setattr(tuning, "READ_AHEAD", replace(tuning.READ_AHEAD, ahead_bytes=0))
            ds = StreamingDataset(local=str(root), batch_size=8, shuffle=True, shuffle_seed=3)
            got = 0
            with Loader(ds, batch_size=8) as loader:
                it = iter(loader)
                while True:
                    try:
                        next(it)
                    except EncodingError as exc:
                        message = str(exc)
                        break
                    got += 1
            ds.close()
            return got, message

    spy = Spy(monkeypatch)
    ahead = read(True)
    assert spy.windows > 0
    assert ahead == read(False)
    assert ahead[0] > 0
    assert "column 's'" in ahead[1]
