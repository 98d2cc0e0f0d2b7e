"""format='parquet': row groups as shards, from a local folder, loopback HTTP (with the
written index) and moto's S3 server; projection, random access, resumption, mixing with
MDS, and bad input. Values are compared with pyarrow's own read of the same files."""

from __future__ import annotations

import asyncio
import collections
import os
import shutil
import struct
from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import parquet_data as data
import pyarrow.parquet as pq
import pytest

from astream import MDSWriter
from astream._coord.world import World
from astream._dataset import tuning
from astream._dataset.dataset import StreamingDataset
from astream._dataset.loader import Loader
from astream._dataset.stream import Stream
from astream._sampling.order import worker_batches
from astream.cli import main as cli
from astream.errors import (
    ConfigError,
    IndexFormatError,
    LayoutWarning,
    ServedSamplesError,
    ShardFormatError,
    SourceChangedError,
    StateError,
    UsageError,
)
from astream.testing import LoopbackServer, moto_s3

TOTAL = data.FILES * sum(data.GROUPS)


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[int, dict[str, Any]]]:
    root = tmp_path_factory.mktemp("parquet")
    paths = data.write(root)
    return root, data.truth(paths)


def _check(batch: dict[str, Any], truth: dict[int, dict[str, Any]]) -> list[int]:
    out = []
    for row in data.rows(batch):
        assert data.same(row, truth[row["id"]]), row["id"]
        out.append(row["id"])
    return out


def test_local_folder_with_workers_every_row_once_exact(folder: tuple[Path, dict[int, dict[str, Any]]],
                                                         tmp_path: Path) -> None:
    root, truth = folder
    ds = StreamingDataset(remote=str(root), local=str(tmp_path / "cache"), format="parquet", shuffle=True,
                          batch_size=32)
    try:
        assert ds.size == TOTAL
        assert ds.columns["id"] == "int64"
        assert ds.columns["ni"] == "nullable:int32"
        assert ds.columns["fx"] == "ndarray:float64:2"
        loader = Loader(ds, num_workers=2, drop_last=False)
        seen = [i for batch in loader for i in _check(batch, truth)]
        loader.close()
        assert sorted(seen) == sorted(truth)
        first = next(iter(Loader(ds, num_workers=0)))
        assert isinstance(first["id"], np.ndarray)
        assert first["id"].dtype == np.int64
        assert isinstance(first["fx"], np.ndarray)
        assert first["fx"].shape == (32, 2)
        assert isinstance(first["s"], list)
    finally:
        ds.close()


def test_projection_fetches_only_its_column_chunks_and_one_row_group(
        folder: tuple[Path, dict[int, dict[str, Any]]], tmp_path: Path) -> None:
    root, truth = folder
    columns = ["id", "s", "lst"]
    ds = StreamingDataset(remote=str(root), local=str(tmp_path / "cache"), format="parquet", columns=columns)
    try:
        assert list(ds.columns) == columns
        sample = ds[2 * sum(data.GROUPS) + 1500]  # file 2, row group 1
        assert {k: data.plain(v) for k, v in sample.items()} == {k: truth[21_500][k] for k in columns}
        cached = [p for p in (tmp_path / "cache").rglob("*.rg*") if p.is_file()]
        assert len(cached) == 1
        assert cached[0].name.startswith("part-02.parquet.")
        assert cached[0].name.endswith(".rg00001")
        # What was fetched is those columns' chunks of that row group and the footer, nothing else.
        path = root / "part-02.parquet"
        meta = pq.read_metadata(path)
        group = meta.row_group(1)
        chunks = sum(group.column(c).total_compressed_size for c in range(group.num_columns)
                     if group.column(c).path_in_schema.split(".")[0] in columns)
        raw = path.read_bytes()
        footer = struct.unpack("<I", raw[-8:-4])[0] + 8
        assert cached[0].stat().st_size == chunks + footer
        assert cached[0].stat().st_size < group.total_byte_size
    finally:
        ds.close()


def test_http_remote_with_written_index_then_resume(folder: tuple[Path, dict[int, dict[str, Any]]],
                                                    tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    src, truth = folder
    root = tmp_path / "served"
    shutil.copytree(src, root)
    with LoopbackServer(str(root)) as server:
        with pytest.raises(UsageError, match="astream index"):
            StreamingDataset(remote=server.url, local=str(tmp_path / "nolist"), format="parquet")
        assert cli(["index", server.url]) == 1  # a web server cannot list: index where it can
        assert "cannot list its files" in capsys.readouterr().err
        assert cli(["-q", "index", str(root)]) == 0
        assert (root / "index.parquet.json").exists()

        def make() -> StreamingDataset:
            return StreamingDataset(remote=server.url, local=str(tmp_path / "cache"), format="parquet",
                                    shuffle=True, shuffle_seed=5, batch_size=64)

        ds = make()
        loader = Loader(ds, num_workers=2)
        seen: list[int] = []
        for n, batch in enumerate(loader, start=1):
            seen.extend(_check(batch, truth))
            if n == 40:
                break
        state = loader.state_dict()
        loader.close()
        ds.close()
        again = make()
        resumed = Loader(again, num_workers=2, drop_last=False)
        resumed.load_state_dict(state)
        rest = [i for batch in resumed for i in _check(batch, truth)]
        resumed.close()
        again.close()
    counts = collections.Counter(seen + rest)
    assert sorted(counts) == sorted(truth)
    assert set(counts.values()) == {1}


def test_s3_prefix_listed(folder: tuple[Path, dict[int, dict[str, Any]]], tmp_path: Path) -> None:
    pytest.importorskip("moto.server", reason="moto[server] is not installed")
    src, truth = folder
    with moto_s3("pq-bucket") as client:
        for path in sorted(src.glob("*.parquet")):
            client.put_object(Bucket="pq-bucket", Key=f"data/{path.name}", Body=path.read_bytes())
        client.put_object(Bucket="pq-bucket", Key="data/_SUCCESS", Body=b"")  # not Parquet: skipped
        ds = StreamingDataset(remote="s3://pq-bucket/data", local=str(tmp_path / "cache"), format="parquet",
                              columns=["id", "b", "st"], shuffle=True, batch_size=100)
        try:
            seen = [i for batch in Loader(ds) for i in (data.rows(batch))
                    if data.same(i, {k: truth[i["id"]][k] for k in ("id", "b", "st")})]
            assert sorted(r["id"] for r in seen) == sorted(truth)
        finally:
            ds.close()


def test_mds_and_parquet_streams_mixed_by_proportion(folder: tuple[Path, dict[int, dict[str, Any]]],
                                                     tmp_path: Path) -> None:
    root, truth = folder
    mds = tmp_path / "mds"
    with MDSWriter(out=str(mds), columns={"id": "int64", "s": "str"}, size_limit="4kb") as writer:
        for i in range(600):
            writer.write({"id": 100_000 + i, "s": f"m{i}"})
    streams = [Stream(remote=str(mds), local=str(tmp_path / "c-mds"), proportion=1),
               Stream(remote=str(root), local=str(tmp_path / "c-pq"), format="parquet", columns=["id", "s"],
                      proportion=3)]
    ds = StreamingDataset(streams=streams, epoch_size=2400, shuffle=True, batch_size=16)
    try:
        ids = [int(i) for batch in Loader(ds, num_workers=2, drop_last=False) for i in batch["id"]]
        from_mds = [i for i in ids if i >= 100_000]
        from_pq = [i for i in ids if i < 100_000]
        assert len(from_mds) == 600
        assert sorted(from_mds) == list(range(100_000, 100_600))
        assert len(from_pq) == 1800
        assert set(from_pq) <= set(truth)
        assert len(set(from_pq)) == 1800
    finally:
        ds.close()


def test_layout_warning_for_small_row_groups(tmp_path: Path) -> None:
    data.write(tmp_path / "small", files=1, groups=(200, 200, 50))
    with pytest.warns(LayoutWarning, match="under 1000 rows.*row_group_size"):
        ds = StreamingDataset(remote=str(tmp_path / "small"), local=str(tmp_path / "cache"), format="parquet")
    assert ds.size == 450
    ds.close()


def test_bad_files_are_named(tmp_path: Path) -> None:
    good = data.write(tmp_path / "a", files=1, groups=(1000,))[0]
    junk = tmp_path / "junk"
    junk.mkdir()
    (junk / "x.parquet").write_bytes(b"not parquet at all, not even close")
    with pytest.raises(ShardFormatError, match=r"x\.parquet: not a Parquet file"):
        StreamingDataset(remote=str(junk), local=str(tmp_path / "c1"), format="parquet")
    # A footer whose length is more than the file holds.
    past = tmp_path / "past"
    past.mkdir()
    raw = good.read_bytes()
    (past / "y.parquet").write_bytes(raw[:-8] + struct.pack("<I", len(raw)) + b"PAR1")
    with pytest.raises(ShardFormatError, match=r"y\.parquet: its footer claims"):
        StreamingDataset(remote=str(past), local=str(tmp_path / "c2"), format="parquet")
    # A file cut short: the footer points to column chunks past its data.
    cut = tmp_path / "cut"
    cut.mkdir()
    footer = struct.unpack("<I", raw[-8:-4])[0] + 8
    (cut / "z.parquet").write_bytes(raw[:200] + raw[-footer:])
    with pytest.raises(ShardFormatError, match=r"z\.parquet: row group 0, column .* past the data"):
        StreamingDataset(remote=str(cut), local=str(tmp_path / "c3"), format="parquet")
    # Two files whose schemas differ.
    mixed = tmp_path / "mixed"
    shutil.copytree(tmp_path / "a", mixed)
    pq.write_table(data.table(5, 1000).drop_columns(["s"]), mixed / "part-09.parquet")
    with pytest.raises(IndexFormatError, match=r"part-09\.parquet has schema .* but part-00\.parquet has"):
        StreamingDataset(remote=str(mixed), local=str(tmp_path / "c4"), format="parquet")
    with pytest.raises(ConfigError, match="has no column 'nope'"):
        StreamingDataset(remote=str(tmp_path / "a"), local=str(tmp_path / "c5"), format="parquet",
                         columns=["id", "nope"])
    with pytest.raises(ConfigError, match="columns= selects Parquet columns"):
        Stream(remote=str(tmp_path / "a"), columns=["id"])
    with pytest.raises(ConfigError, match="validate_hash does not apply to format='parquet'"):
        StreamingDataset(remote=str(tmp_path / "a"), format="parquet", validate_hash="xxh64")
    with pytest.raises(ConfigError, match="format must be one of"):
        Stream(remote=str(tmp_path / "a"), format="orc")


def test_a_changed_file_is_refused(tmp_path: Path) -> None:
    root = tmp_path / "data"
    data.write(root, files=2, groups=(1000, 1000))
    ds = StreamingDataset(remote=str(root), local=str(tmp_path / "cache"), format="parquet", batch_size=10)
    state = Loader(ds).state_dict()
    try:
        # Rewritten after the index was built: the row group's fetch sees another footer.
        pq.write_table(data.table(7, 2000), root / "part-01.parquet", row_group_size=1000)
        os.utime(root / "part-01.parquet", ns=(1, 1))
        with pytest.raises(SourceChangedError, match=r"part-01\.parquet: the file changed"):
            ds[3000]
        assert int(ds[10]["id"]) == 10  # the unchanged file still reads
    finally:
        ds.close()
    fresh = StreamingDataset(remote=str(root), local=str(tmp_path / "cache"), format="parquet", batch_size=10)
    try:
        with pytest.raises(StateError):
            fresh.load_state_dict(state)
        assert int(fresh[3000]["id"]) == 70_000 + 1000
    finally:
        fresh.close()


@pytest.mark.parametrize("over", ["local", "http"])
def test_a_file_rewritten_to_the_same_size_is_refused_by_its_footer(tmp_path: Path, over: str) -> None:
    """A local folder's row groups are copied in one job (a kernel copy of each range), an
    HTTP remote's by ranged requests: both check the footer before a byte is kept."""
    root = tmp_path / "data"
    data.write(root, files=2, groups=(1000, 1000))
    target = root / "part-01.parquet"
    table = pq.read_table(target)
    pq.write_table(table.replace_schema_metadata({"v": "1"}), target, row_group_size=1000)
    cli(["-q", "index", str(root)])
    with LoopbackServer(str(root)) as server:
        remote = str(root) if over == "local" else server.url
        ds = StreamingDataset(remote=remote, local=str(tmp_path / "cache"), format="parquet", batch_size=10)
        try:
            size = target.stat().st_size
            pq.write_table(table.replace_schema_metadata({"v": "2"}), target, row_group_size=1000)
            assert target.stat().st_size == size  # only the footer's bytes differ
            with pytest.raises(SourceChangedError, match=r"part-01\.parquet: the file changed .*its footer differs"):
                ds[3000]
            assert not [p for p in (tmp_path / "cache").rglob("*") if p.is_file() and "part-01" in p.name]
            assert int(ds[10]["id"]) == 10  # the unchanged file still reads
        finally:
            ds.close()


def test_bounded_cache_evicts_row_groups_and_a_local_folder_reads_in_place(tmp_path: Path) -> None:
    root = tmp_path / "data"
    paths = data.write(root, files=1, groups=(1000,) * 4)
    columns = ["id", "f64", "s"]
    truth = data.truth(paths, columns)
    probe = StreamingDataset(local=str(root), format="parquet", columns=columns)  # the folder as local=
    try:
        assert probe.config.streams[0].remote == str(root)
        sizes = [sh.raw_data.bytes for sh in probe.indexes[0].shards]
    finally:
        probe.close()
    limit = 3 * max(sizes)  # a batch of 2 spans 2 row groups, one more for ds[i]: 3 of the 4 fit
    ds = StreamingDataset(remote=str(root), local=str(tmp_path / "cache"), format="parquet", columns=columns,
                          cache_limit=limit, batch_size=2)
    try:
        seen = [i for batch in Loader(ds, drop_last=False) for i in _check(batch, truth)]
        assert sorted(seen) == sorted(truth)
        on_disk = sum(p.stat().st_size for p in (tmp_path / "cache").rglob("*.rg*") if p.is_file())
        assert on_disk <= limit
        stats = ds.stats()
        assert stats.evictions > 0
        assert stats.bytes_downloaded >= sum(sizes)  # ranged fetches are counted
    finally:
        ds.close()


def test_a_torn_cached_index_is_rebuilt(folder: tuple[Path, dict[int, dict[str, Any]]], tmp_path: Path) -> None:
    # The cached footers are written without fsync: after a power cut the file may be empty
    # or cut short, and must then be read from the files again, never trusted.
    root, truth = folder
    cache = tmp_path / "cache"
    first = StreamingDataset(remote=str(root), local=str(cache), format="parquet")
    size = first.size
    first.close()
    cached = cache / "index.parquet.json"
    whole = cached.read_bytes()
    for torn in (b"", whole[: len(whole) // 2], bytes(len(whole))):
        cached.write_bytes(torn)
        again = StreamingDataset(remote=str(root), local=str(cache), format="parquet")
        try:
            assert again.size == size
            assert cached.read_bytes() == whole
            loader = Loader(again, batch_size=16, drop_last=False)
            assert len(_check(next(iter(loader)), truth)) == 16
            loader.close()
        finally:
            again.close()


def test_unshuffled_batches_are_runs_of_rows_exact(folder: tuple[Path, dict[int, dict[str, Any]]],
                                                   tmp_path: Path) -> None:
    # Unshuffled, a batch's rows within a row group are consecutive: sliced, not gathered,
    # for every kind of column (numbers, nullable scalars, strings, bytes, lists, nulls).
    root, truth = folder
    ds = StreamingDataset(remote=str(root), local=str(tmp_path / "cache"), format="parquet", batch_size=64)
    try:
        seen = [i for batch in Loader(ds, drop_last=False) for i in _check(batch, truth)]
        assert seen == sorted(truth)
    finally:
        ds.close()


def test_two_projections_on_one_local_cache_each_resume_exact(folder: tuple[Path, dict[int, dict[str, Any]]],
                                                              tmp_path: Path) -> None:
    # A dataset's node agent serves the index that dataset built, not the index.json in the
    # cache folder, which a later dataset on the same folder with other columns rewrote (its
    # row groups are other shards: the agent used to serve those, a ShardFormatError here).
    root, truth = folder
    cache = str(tmp_path / "cache")
    columns = ["id", "s", "lst"]
    narrow = StreamingDataset(remote=str(root), local=cache, format="parquet", columns=columns, batch_size=50)
    wide = StreamingDataset(remote=str(root), local=cache, format="parquet", batch_size=50)
    try:
        loader = Loader(narrow, drop_last=False)
        loader.load_state_dict({**loader.state_dict(), "sample_in_epoch": 5000})
        rows = [row for batch in loader for row in data.rows(batch)]
        loader.close()
        assert [r["id"] for r in rows] == sorted(truth)[5000:]
        assert all(data.same(r, {k: truth[r["id"]][k] for k in columns}) for r in rows)
        loader = Loader(wide, drop_last=False)
        assert [i for batch in loader for i in _check(batch, truth)] == sorted(truth)
        loader.close()
    finally:
        narrow.close()
        wide.close()


def test_shuffled_resume_on_two_nodes_every_row_once_exact(folder: tuple[Path, dict[int, dict[str, Any]]],
                                                            tmp_path: Path) -> None:
    # py1e resumed mid-epoch orders only the rest of each canonical node (the tail of its
    # argsort): the rows seen before the state and after it on another world, two nodes
    # of one rank (each its own cache and agent), are every row once, exact.
    root, truth = folder

    def make(rank: int, nodes: int) -> StreamingDataset:
        return StreamingDataset(remote=str(root), local=str(tmp_path / f"cache{nodes}.{rank}"), format="parquet",
                                shuffle=True, shuffle_seed=3, num_canonical_nodes=2, batch_size=40,
                                world=World(rank=rank, world_size=nodes, local_rank=0, ranks_per_node=1))

    first = make(0, 1)
    loader = Loader(first, drop_last=False)
    seen: list[int] = []
    for n, batch in enumerate(loader, start=1):
        seen.extend(_check(batch, truth))
        if n == 100:
            break
    state = loader.state_dict()
    loader.close()
    first.close()
    rest: list[int] = []
    ids = sorted(truth)  # sample i of the dataset is the i-th row of the files in order
    for rank in range(2):
        ds = make(rank, 2)
        resumed = Loader(ds, drop_last=False)
        resumed.load_state_dict(state)
        mine = [i for batch in resumed for i in _check(batch, truth)]
        resumed.close()
        # The same plan with the whole shuffle computed: the rank's order is its tail.
        whole = ds.config.epoch_plan(ds.sample_map.stream_shard_sizes(), num_canonical_nodes=2, shuffle_seed=3,
                                     initial_physical_nodes=1, epoch=0, sample_in_epoch=4000, workers_per_rank=1,
                                     batch_size=40)
        assert len(whole.shuffle_ids) == TOTAL
        order = worker_batches(whole, rank, 0, 0)
        assert mine == [ids[k] for k in order.ids[: order.num_samples].tolist()]
        rest.extend(mine)
        ds.close()
    assert len(seen) == 4000
    assert sorted(seen + rest) == sorted(truth)


def _delayed_agent_copies(monkeypatch: pytest.MonkeyPatch, seconds: float) -> None:
    """The (thread-mode) node agent's copies of local row groups start ``seconds`` late, so a
    row group decoded ahead of its install is ready before its lease."""
    from astream._storage.local import LocalStorage

    copy_into = LocalStorage.copy_into

    async def late(self: LocalStorage, *args: Any, **kwargs: Any) -> None:
        await asyncio.sleep(seconds)
        await copy_into(self, *args, **kwargs)

    monkeypatch.setattr(LocalStorage, "copy_into", late)  # (the agent runs on this process's threads)


def _count_decodes(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    from astream._format.parquet import reader as parquet_reader

    made: list[str] = []
    init = parquet_reader.RowGroupReader.__init__

    def counted(self: Any, path: str, *args: Any, **kwargs: Any) -> None:
        made.append(path)
        init(self, path, *args, **kwargs)

    monkeypatch.setattr(parquet_reader.RowGroupReader, "__init__", counted)
    return made


@pytest.mark.parametrize("late", [0.0, 0.3])
def test_a_resume_decodes_its_first_row_group_once_ahead_of_its_install_exact(
        folder: tuple[Path, dict[int, dict[str, Any]]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        late: float) -> None:
    # load_state_dict reads and decodes the resume's row group while the node agent starts
    # (astream._dataset.start.preopen); the first batches come from that decoding, checked against
    # the installed file, and the row group is decoded once, not again from the cache.
    root, truth = folder
    if late:
        _delayed_agent_copies(monkeypatch, late)  # the decoding is surely first: served early
    made = _count_decodes(monkeypatch)
    ds = StreamingDataset(remote=str(root), local=str(tmp_path / "cache"), format="parquet", batch_size=50)
    try:
        loader = Loader(ds, drop_last=False)
        loader.load_state_dict({**loader.state_dict(), "sample_in_epoch": 2100})  # row group 2 of file 0
        seen = [i for batch in loader for i in _check(batch, truth)]
        loader.close()
        assert seen == sorted(truth)[2100:]
        ahead = [p for p in made if "read ahead of its install" in p]
        assert len(ahead) == 1
        assert [p for p in made if "rg00002" in p and "part-00" in p] == []  # not decoded again
    finally:
        ds.close()


def test_a_row_group_decoded_ahead_from_other_bytes_stops_the_epoch(
        folder: tuple[Path, dict[int, dict[str, Any]]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # Served before its install, a row group whose bytes turn out not to be the installed
    # ones (the source changed between the two reads) stops the iteration loudly; without
    # the early serving the installed file is decoded instead (no error, exact rows).
    import astream._dataset.start.preopen as preopen_module

    root, truth = folder
    _delayed_agent_copies(monkeypatch, 0.3)

    class OtherDigest:
        @staticmethod
        def xxh3_64_intdigest(data: bytes) -> int:
            return 12345  # as if the bytes read ahead were not the ones installed

    monkeypatch.setattr(preopen_module, "xxhash", OtherDigest)
    ds = StreamingDataset(remote=str(root), local=str(tmp_path / "cache"), format="parquet", batch_size=50)
    try:
        loader = Loader(ds, drop_last=False)
        loader.load_state_dict({**loader.state_dict(), "sample_in_epoch": 2100})
        with pytest.raises(ServedSamplesError, match="served before it was installed"):
            _ = [_check(batch, truth) for batch in loader]
        loader.close()
    finally:
        ds.close()
    monkeypatch.undo()
    monkeypatch.setattr(preopen_module, "xxhash", OtherDigest)
    fresh = StreamingDataset(remote=str(root), local=str(tmp_path / "cache2"), format="parquet", batch_size=50)
    try:
        loader = Loader(fresh, drop_last=False)
        state = {**loader.state_dict(), "sample_in_epoch": 2100}
        from astream._dataset.read.shards import OpenShards

        monkeypatch.setattr(OpenShards, "offered", lambda self, shard: None)  # never served early
        made = _count_decodes(monkeypatch)
        loader.load_state_dict(state)
        assert [i for batch in loader for i in _check(batch, truth)] == sorted(truth)[2100:]
        loader.close()
        assert len([p for p in made if "rg00002" in p and "part-00" in p]) == 1  # the installed file, decoded
    finally:
        fresh.close()


def test_a_shuffled_resume_decodes_ahead_within_its_budget_exact(
        folder: tuple[Path, dict[int, dict[str, Any]]], tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A shuffled first batch reads many row groups: only the first ones up to the budget are
    # decoded ahead (one thread, in the order they are read); every row once, exact.

    root, truth = folder
    monkeypatch.setattr(tuning, "READ_AHEAD", replace(tuning.READ_AHEAD, preopen_bytes=1))  # not even one: nothing ahead
    made = _count_decodes(monkeypatch)

    def resumed(cache: str) -> list[int]:
        ds = StreamingDataset(remote=str(root), local=cache, format="parquet", shuffle=True, shuffle_seed=9,
                              shuffle_block_size=5000, batch_size=200)
        try:
            loader = Loader(ds, drop_last=False)
            loader.load_state_dict({**loader.state_dict(), "sample_in_epoch": 3000})
            seen = [i for batch in loader for i in _check(batch, truth)]
            loader.close()
            return seen
        finally:
            ds.close()

    nothing_ahead = resumed(str(tmp_path / "a"))
    assert not [p for p in made if "read ahead of its install" in p]
    sizes = sorted(p.stat().st_size for p in (tmp_path / "a").rglob("*.rg*"))
    monkeypatch.setattr(tuning, "READ_AHEAD", replace(tuning.READ_AHEAD, preopen_bytes=sizes[-1] + sizes[-2]))  # room for two at most
    made.clear()
    assert resumed(str(tmp_path / "b")) == nothing_ahead
    assert 1 <= len([p for p in made if "read ahead of its install" in p]) <= 2
    assert len(nothing_ahead) == len(set(nothing_ahead)) == TOTAL - 3000
