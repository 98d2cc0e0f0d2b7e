"""on_bad_sample="skip": planted faults in every format, read over loopback HTTP.

Each fault is one dataset of 60 samples (batches of 4): with the default ``"raise"`` the
error is today's; with ``"skip"`` the epoch has the batches a clean dataset has, every bad
sample replaced by a repeat of the next good one of its batch, the same on a rerun, after
a resume and in the next epoch, and recorded in the state, ``stats()`` and the log.
"""

from __future__ import annotations

import logging
import shutil
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import bad_data as bd
import numpy as np
import parquet_data as pdata
import pyarrow.parquet as pq
import pytest

from astream._dataset.dataset import StreamingDataset
from astream._dataset.loader import Loader
from astream._dataset.quarantine import QUARANTINE_KEY
from astream._sampling.substitute import in_batch
from astream.cli import main as cli
from astream.errors import (
    BadDataError,
    EncodingError,
    HashMismatchError,
    ShardFormatError,
    SizeMismatchError,
    TransformError,
    WorkerError,
)
from astream.testing import LoopbackServer

SAMPLES = 60
BATCH = 4
# Row groups of 20 rows are what the fault needs (three small shards), not what streaming wants.
pytestmark = pytest.mark.filterwarnings("ignore::astream.errors.LayoutWarning")


@dataclass(frozen=True)
class Fault:
    """A dataset with one planted fault: how to make it, read it, and what raise gives."""

    name: str
    plant: Callable[[Path], None]
    error: type[Exception]
    kwargs: dict[str, Any]
    whole_shard: bool  # the fault loses the shard (all its samples), not one record

    def global_id(self, batch: dict[str, Any], n: int) -> int:
        if "__key__" in batch:
            return int(str(batch["__key__"][n]).rsplit("/", 1)[1])
        return int(batch["id"][n])


def _mds_zstd(root: Path) -> None:
    bd.write_mds(root, SAMPLES, compression="zstd")
    bd.corrupt_mds_record(root, 13)


def _mds_truncated(root: Path) -> None:
    shards = bd.write_mds(root, SAMPLES)
    bd.truncate_file(root / shards[2]["raw_data"]["basename"])


def _mds_flipped(root: Path) -> None:
    shards = bd.write_mds(root, SAMPLES, hashes=["xxh64"])
    bd.flip_byte(root / shards[3]["raw_data"]["basename"])


def _jsonl(root: Path) -> None:
    root.mkdir()
    bd.write_jsonl(root, SAMPLES, 17)


def _parquet(root: Path) -> None:
    pdata.write(root, files=1, groups=(20, 20, 20))
    assert cli(["-q", "index", str(root)]) == 0
    path = root / "part-00.parquet"
    column = pq.ParquetFile(path).metadata.row_group(1).column(0)
    data = bytearray(path.read_bytes())
    for k in range(column.data_page_offset, column.data_page_offset + 40):  # row group 1's page header
        data[k] ^= 0x5A
    path.write_bytes(bytes(data))


def _wds(root: Path) -> None:
    root.mkdir()
    for k in range(3):
        bd.write_tar(root / f"shard-{k:03d}.tar", k * 20, 20)
    assert cli(["-q", "index", str(root)]) == 0
    bd.truncate_member(root / "shard-001.tar", 33)


FAULTS = [
    Fault("mds-zstd-record", _mds_zstd, EncodingError, {}, False),
    Fault("mds-truncated-shard", _mds_truncated, SizeMismatchError, {}, True),
    Fault("mds-flipped-byte", _mds_flipped, HashMismatchError, {"validate_hash": "xxh64"}, True),
    Fault("jsonl-record", _jsonl, EncodingError, {}, False),
    Fault("parquet-row-group", _parquet, ShardFormatError, {"format": "parquet"}, True),
    Fault("webdataset-truncated-member", _wds, SizeMismatchError, {"format": "webdataset"}, True),
]


@pytest.fixture(scope="module", params=FAULTS, ids=lambda f: f.name)
def served(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Iterator[tuple[Fault, str]]:
    fault: Fault = request.param
    root = tmp_path_factory.mktemp(fault.name) / "remote"
    fault.plant(root)
    with LoopbackServer(str(root)) as server:
        yield fault, server.url


def _dataset(url: str, cache: Path, fault: Fault, **kwargs: Any) -> StreamingDataset:
    return StreamingDataset(remote=url, local=str(cache), batch_size=BATCH, shuffle=True, shuffle_seed=5,
                            **fault.kwargs, **kwargs)


def _epoch(loader: Loader, fault: Fault, take: int | None = None) -> list[list[int]]:
    out = []
    for batch in loader:
        out.append([fault.global_id(batch, n) for n in range(len(batch["__key__" if "__key__" in batch else "id"]))])
        if take is not None and len(out) == take:
            break
    return out


def _bad_ids(ds: StreamingDataset, fault: Fault, stats_ids: set[int]) -> set[int]:
    """The samples the fault makes bad: the planted record, or every sample of the lost shard."""
    if not fault.whole_shard:
        return stats_ids
    shard, _ = ds.sample_map.locate_one(min(stats_ids))
    starts = ds.sample_map.starts
    return set(range(int(starts[shard]), int(starts[shard + 1])))


def _skip_lines(caplog: pytest.LogCaptureFixture) -> list[str]:
    return [r.getMessage() for r in caplog.records
            if r.levelno >= logging.WARNING and "on_bad_sample='skip'" in r.getMessage()]


def test_raise_is_the_default_and_its_error_is_todays(served: tuple[Fault, str], tmp_path: Path) -> None:
    fault, url = served
    ds = _dataset(url, tmp_path / "cache", fault)
    try:
        with pytest.raises(fault.error):
            _epoch(Loader(ds), fault)
    finally:
        ds.close()


def test_skip_keeps_every_batch_and_substitutes_by_the_rule(served: tuple[Fault, str], tmp_path: Path,
                                                            caplog: pytest.LogCaptureFixture) -> None:
    fault, url = served
    caplog.set_level(logging.WARNING, "astream.dataset")
    ds = _dataset(url, tmp_path / "cache", fault, on_bad_sample="skip", max_bad_samples=30)
    try:
        loader = Loader(ds, num_workers=2, worker_mode="thread")
        planned = loader.batch_ids(0)
        got = _epoch(loader, fault)
        stats = loader.stats()
        state = loader.state_dict()
    finally:
        ds.close()
    assert [len(b) for b in got] == [len(b) for b in planned]  # the same batches, the same sizes
    quarantined = {q[0] for q in stats.quarantined}
    bad = _bad_ids(ds, fault, quarantined)
    assert quarantined == bad
    assert {q[2] for q in stats.quarantined} <= {"decode", "hash", "size"}
    assert stats.bad_samples == sum(int(i) in bad for b in planned for i in b)
    assert state[QUARANTINE_KEY] == {"ids": sorted(bad), "rank": 0, "spent": stats.bad_samples}
    met = 0
    everything = {int(i) for b in planned for i in b}
    for want, have in zip(planned, got, strict=True):
        flags = np.isin(want, list(bad))
        src = in_batch(flags)
        if src is None:  # all bad: one good sample of the worker's sequence stands in for all
            assert len(set(have)) == 1
            assert have[0] in everything - bad
        else:
            assert have == [int(want[s]) for s in src]  # the next good sample of the batch stands in
        met += int(flags.sum())
    assert met == stats.bad_samples
    lines = _skip_lines(caplog)
    if fault.whole_shard:
        # One line for the shard from each worker that reads some of it (its samples at DEBUG).
        assert 1 <= len(lines) <= 2
        assert len(set(lines)) == 1
        assert "unreadable" in lines[0]
        assert f"all its {len(bad)} samples" in lines[0]
    else:
        (only,) = bad
        assert len(lines) == 1
        assert f"sample {only} of " in lines[0]
        assert "substitute" in lines[0]


def test_a_rerun_a_resume_and_the_next_epoch_substitute_alike(served: tuple[Fault, str], tmp_path: Path,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    fault, url = served
    caplog.set_level(logging.WARNING, "astream.dataset")
    runs = []
    for k in range(2):
        ds = _dataset(url, tmp_path / f"cache{k}", fault, on_bad_sample="skip", max_bad_samples=30)
        try:
            runs.append(_epoch(Loader(ds, num_workers=2, worker_mode="thread"), fault))
        finally:
            ds.close()
    assert runs[0] == runs[1]
    full = runs[0]
    # A state taken after the batch that holds the first bad sample (or the lost shard's first).
    ds = _dataset(url, tmp_path / "cache-part", fault, on_bad_sample="skip", max_bad_samples=30)
    try:
        loader = Loader(ds, num_workers=2, worker_mode="thread")
        planned = loader.batch_ids(0)
        first_bad = next(k for k, (want, have) in enumerate(zip(planned, full, strict=True))
                         if [int(i) for i in want] != have)
        take = first_bad + 1
        part = _epoch(loader, fault, take=take)
        state = loader.state_dict()
        loader.close()
    finally:
        ds.close()
    assert part == full[:take]
    assert state[QUARANTINE_KEY]["ids"]
    caplog.clear()
    ds = _dataset(url, tmp_path / "cache-part", fault, on_bad_sample="skip", max_bad_samples=30)
    try:
        loader = Loader(ds, num_workers=2, worker_mode="thread")
        loader.load_state_dict(state)
        rest = _epoch(loader, fault)
        assert part + rest == full
        if not fault.whole_shard:
            assert not _skip_lines(caplog)  # the bad sample was in the state: not read, not reported again
        caplog.clear()
        second = _epoch(loader, fault)  # epoch 1: every bad sample known from the start
        assert not _skip_lines(caplog)
        stats = loader.stats()
    finally:
        ds.close()
    assert [len(b) for b in second] == [len(b) for b in loader.batch_ids(1)]
    bad = _bad_ids(ds, fault, {q[0] for q in stats.quarantined})
    assert not {i for b in second for i in b} & bad


def test_the_budget_stops_at_the_first_sample_over_it(served: tuple[Fault, str], tmp_path: Path) -> None:
    fault, url = served
    ds = _dataset(url, tmp_path / "cache", fault, on_bad_sample="skip", max_bad_samples=0)
    try:
        loader = Loader(ds)
        planned = loader.batch_ids(0)
        got: list[list[int]] = []

        def iterate() -> None:
            got.extend([fault.global_id(batch, n) for n in range(BATCH)] for batch in loader)

        with pytest.raises(BadDataError, match=r"rank 0 met 1 bad samples this epoch, more than max_bad_samples=0") as caught:
            iterate()
    finally:
        ds.close()
    assert all([int(i) for i in want] == have for want, have in zip(planned, got, strict=False))
    (first,) = caught.value.bad
    assert first[0] in {int(i) for i in planned[len(got)]}  # the batch that would hold it was not handed out


def test_a_fraction_budget_is_of_the_ranks_epoch(served: tuple[Fault, str], tmp_path: Path) -> None:
    fault, url = served
    ds = _dataset(url, tmp_path / "cache", fault, on_bad_sample="skip", max_bad_samples=0.9)
    try:
        assert len(_epoch(Loader(ds), fault)) == SAMPLES // BATCH
    finally:
        ds.close()


# -- the user's transform ---------------------------------------------------------------------

ODD = 7


def odd_one_out(sample: dict[str, Any]) -> dict[str, Any]:
    if int(sample["id"]) == ODD:
        raise ValueError(f"sample {ODD} is odd")
    return sample


def key_error_on_odd(sample: dict[str, Any]) -> dict[str, Any]:
    if int(sample["id"]) == ODD:
        raise KeyError(ODD)
    return sample


@pytest.fixture(scope="module")
def clean(tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    root = tmp_path_factory.mktemp("clean") / "remote"
    bd.write_mds(root, SAMPLES)
    with LoopbackServer(str(root)) as server:
        yield server.url


@pytest.mark.parametrize("mode", ["thread", "process"])
def test_a_listed_transform_error_is_a_bad_sample(clean: str, tmp_path: Path, mode: str) -> None:
    ds = StreamingDataset(remote=clean, local=str(tmp_path / "c"), batch_size=BATCH, shuffle=True,
                          on_bad_sample="skip", skip_exceptions=(ValueError,), transform=odd_one_out)
    try:
        loader = Loader(ds, num_workers=2, worker_mode=mode)
        planned = loader.batch_ids(0)
        got = [[int(i) for i in b["id"]] for b in loader]
        stats = loader.stats()
    finally:
        ds.close()
    for want, have in zip(planned, got, strict=True):
        src = in_batch(np.asarray(want) == ODD)
        assert src is not None
        assert have == [int(want[s]) for s in src]
    ((sample, shard, reason, cause),) = stats.quarantined
    assert (sample, reason) == (ODD, "transform")
    assert shard.startswith("shard.")
    assert "ValueError" in cause


def test_an_unlisted_transform_error_still_stops(clean: str, tmp_path: Path) -> None:
    ds = StreamingDataset(remote=clean, local=str(tmp_path / "c"), batch_size=BATCH,
                          on_bad_sample="skip", skip_exceptions=(ValueError,), transform=key_error_on_odd)
    try:
        with pytest.raises(TransformError, match="KeyError"):
            list(Loader(ds))
        with pytest.raises(WorkerError, match="KeyError"):
            list(Loader(ds, num_workers=2, worker_mode="thread"))
    finally:
        ds.close()


def test_a_batch_with_no_good_sample_repeats_the_nearest_later_one(tmp_path: Path) -> None:
    root = tmp_path / "remote"
    shards = bd.write_mds(root, 24, size_limit=400, hashes=["xxh64"])
    assert all(s["samples"] < BATCH * 2 for s in shards)
    lost = shards[1]
    bd.flip_byte(root / lost["raw_data"]["basename"])
    ds = StreamingDataset(remote=str(root), local=str(tmp_path / "c"), batch_size=2, validate_hash="xxh64",
                          on_bad_sample="skip")
    try:
        loader = Loader(ds)
        planned = [[int(i) for i in b] for b in loader.batch_ids(0)]
        got = [[int(i) for i in b["id"]] for b in loader]
    finally:
        ds.close()
    first = shards[0]["samples"]
    bad = set(range(first, first + lost["samples"]))
    assert len(got) == len(planned)
    for k, (want, have) in enumerate(zip(planned, got, strict=True)):
        if set(want) <= bad:
            later = next(i for b in planned[k + 1:] for i in b if i not in bad)
            assert have == [later] * len(want)
        else:
            assert not set(have) & bad


def test_skip_parameters_need_skip(clean: str, tmp_path: Path) -> None:
    from astream.errors import ConfigError

    with pytest.raises(ConfigError, match="only with on_bad_sample='skip'"):
        StreamingDataset(remote=clean, local=str(tmp_path / "c"), max_bad_samples=3)
    shutil.rmtree(tmp_path / "c", ignore_errors=True)
