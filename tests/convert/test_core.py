"""The engine-neutral core: Arrow type inference, write_partition, merge_index (local and S3)."""

from __future__ import annotations

import os
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from astream import LocalDataset, StreamingDataset
from astream.convert import PartFragment, arrow_columns, merge_index, write_partition
from astream.errors import ConfigError, IndexFormatError, SampleError
from astream.testing import moto_s3

from .convertkit import SCHEMA, check_no_orphans, check_samples, local_files, table

INFERRED = {
    "id": "int", "small": "int16", "f32": "float32", "f64": "float64", "flag": "uint8", "text": "str",
    "blob": "bytes", "day": "int64", "when": "int64", "vec": "ndarray:float32:4", "mat": "ndarray:int32:2,3",
    "ragged": "ndarray:int64", "grid": "ndarray:float64", "meta": "json",
}


def test_columns_are_inferred_from_the_arrow_schema() -> None:
    assert arrow_columns(SCHEMA) == INFERRED
    assert arrow_columns(SCHEMA, {"id": "int32"})["id"] == "int32"


@pytest.mark.parametrize("kind", [pa.time32("s"), pa.null(), pa.list_(pa.list_(pa.binary())), pa.duration("s")])
def test_a_type_mds_cannot_store_names_the_column_and_the_types(kind: pa.DataType) -> None:
    with pytest.raises(ConfigError, match=r"column 'bad' has Arrow type .* the types it can take are bool, int8"):
        arrow_columns(pa.schema([("ok", pa.int64()), ("bad", kind)]))


def test_bad_overrides_are_refused() -> None:
    with pytest.raises(ConfigError, match="names nope"):
        arrow_columns(SCHEMA, {"nope": "int"})
    with pytest.raises(ConfigError, match="column 'id'"):
        arrow_columns(SCHEMA, {"id": "int77"})


def test_partitions_merge_into_one_dataset_in_partition_order(tmp_path: Path) -> None:
    out = str(tmp_path / "ds")
    t = table(30)
    # Written out of order, one partition empty, one retried: the index is in partition order, once each.
    fragments = [write_partition(t.slice(10), out, 2, size_limit=600),
                 write_partition(t.slice(0, 0), out, 1),
                 write_partition(t.slice(0, 10), out, 0, size_limit=600, compression="zstd", hashes=["xxh64"])]
    with pytest.raises(ConfigError, match="other columns or compression"):
        merge_index(fragments)
    fragments[2] = write_partition(t.slice(0, 10), out, 0, size_limit=600)  # the retry replaces part-00000
    assert [f.samples for f in fragments] == [20, 0, 10]
    assert merge_index(fragments) == os.path.join(out, "index.json")
    ds = LocalDataset(out)
    assert [int(ds[i]["id"]) for i in range(len(ds))] == list(range(30))
    check_samples((ds[i] for i in range(len(ds))), 30)
    check_no_orphans(local_files(out), (tmp_path / "ds" / "index.json").read_bytes())
    assert all(s.raw_data.basename.startswith("part-0000") for s in ds.index.shards)


def test_recovery_by_listing_and_mosaicml_form(tmp_path: Path) -> None:
    out = tmp_path / "ds"
    for k in range(3):
        write_partition(table(5, 5 * k), str(out), k, size_limit=500)
    first = merge_index(str(out))
    merged = (out / "index.json").read_bytes()
    os.unlink(first)
    urls = [str(out / f"part-{k:05d}" / "index.json") for k in range(3)]
    merge_index(urls, str(out), keep_local=True, download_timeout=5)
    assert (out / "index.json").read_bytes() == merged
    check_samples(iter(LocalDataset(str(out))), 15)
    (out / "part-00001" / "index.json").unlink()
    with pytest.raises(IndexFormatError, match="part-00001"):
        merge_index(str(out))


def test_nulls_dicts_and_fragments(tmp_path: Path) -> None:
    t = pa.table({"x": pa.array([1, None], pa.int64())})
    with pytest.raises(SampleError, match=r"row 1: column 'x' \(int\) is null"):
        write_partition(t, str(tmp_path / "a"), 0)
    with pytest.raises(ConfigError, match="need columns="):
        write_partition([{"x": 1}], str(tmp_path / "b"), 0)
    fragment = write_partition(iter([{"x": 1}, {"x": 2}]), str(tmp_path / "b"), 3, columns={"x": "int"})
    assert PartFragment.from_json(fragment.to_json()) == fragment
    reshaped = write_partition(table(3).select(["vec"]), str(tmp_path / "c"), 0, columns={"vec": "ndarray:float32:2,2"})
    merge_index([reshaped])
    assert LocalDataset(str(tmp_path / "c"))[1]["vec"].shape == (2, 2)
    with pytest.raises(ConfigError, match="partition_id"):
        write_partition([], str(tmp_path / "d"), -1, columns={"x": "int"})


def test_s3_output_uploads_each_shard_and_frees_the_disk(tmp_path: Path) -> None:
    local = tmp_path / "staging"
    with moto_s3("conv") as s3:
        fragments = [write_partition(table(20, 20 * k), (str(local), "s3://conv/ds"), k, size_limit=800,
                                     compression="zstd") for k in range(2)]
        assert merge_index(fragments) == "s3://conv/ds/index.json"
        # Only the parts' own indexes stay in the local folder of the pair (keep_local=False).
        assert {p for p in local_files(str(local)) if not p.endswith("index.json")} == set()
        keys = {o["Key"][3:] for o in s3.list_objects_v2(Bucket="conv")["Contents"]}
        check_no_orphans(keys, s3.get_object(Bucket="conv", Key="ds/index.json")["Body"].read())
        ds = StreamingDataset(remote="s3://conv/ds", local=str(tmp_path / "cache"), batch_size=4)
        check_samples((ds[i] for i in range(len(ds))), 40)
        recovered = merge_index("s3://conv/ds")
        assert recovered == "s3://conv/ds/index.json"
    assert np.dtype("int64")  # keeps numpy imported for the helpers' arrays


def test_the_core_imports_no_engine() -> None:
    import subprocess
    import sys

    code = ("import sys, astream.convert, astream.convert.dask, astream.convert.spark; "
            "print(sorted(m for m in ('pyspark', 'ray', 'dask', 'distributed') if m in sys.modules))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


def test_empty_partitions_and_what_killed_attempts_left(tmp_path: Path) -> None:
    out = tmp_path / "ds"
    dead = out / ".astream-staging" / "part-00000-deadbeef"
    dead.mkdir(parents=True)
    (dead / "shard.00000.mds").write_bytes(b"half a shard")
    fragments = [write_partition(table(4), str(out), 0), write_partition([], str(out), 1)]
    assert fragments[1].shards == ()
    merge_index(fragments)
    assert not (out / ".astream-staging").exists()
    assert len(LocalDataset(str(out))) == 4


def test_every_public_name_resolves() -> None:
    import astream.convert as convert

    pytest.importorskip("pyspark")
    pytest.importorskip("ray")
    for name in convert.__all__:
        assert getattr(convert, name) is not None, name
    with pytest.raises(AttributeError):
        _ = convert.nothing_here  # type: ignore[attr-defined]


def test_a_root_of_mosaicml_writer_folders_merges_in_their_listed_order(tmp_path: Path) -> None:
    """MosaicML's ``merge_index(out_root)``: sub-folders of any name, each written by an
    ``MDSWriter`` of a parallel conversion, merged in sorted path order (``10`` before ``2``)."""
    from astream import MDSWriter

    out = tmp_path / "ds"
    for group in (2, 10, 0):
        with MDSWriter(out=str(out / str(group)), columns={"n": "int"}, size_limit=64) as writer:
            for n in range(group * 100, group * 100 + 3):
                writer.write({"n": n})
    (out / ".astream-staging" / "part-00000-dead").mkdir(parents=True)  # an unfinished attempt: not a part
    (out / ".astream-staging" / "part-00000-dead" / "index.json").write_text('{"version": 2, "shards": []}')
    merge_index(str(out))
    ds = LocalDataset(str(out))
    assert [ds[i]["n"] for i in range(len(ds))] == [0, 1, 2, 1000, 1001, 1002, 200, 201, 202]
    with pytest.raises(IndexFormatError, match="sub-folder"):
        merge_index(str(tmp_path / "ds" / "0"))


def test_shards_staged_for_an_upload_are_not_fsynced(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """fsync only where the local file is kept: a busy disk's fsync would hold up a staged shard."""
    import astream._format.files as files_module
    from astream.testing import memory_bucket

    synced: list[str] = []
    real = os.fsync

    def fsync(fd: int) -> None:
        synced.append(os.path.basename(os.readlink(f"/proc/self/fd/{fd}")))
        real(fd)

    monkeypatch.setattr(files_module.os, "fsync", fsync)
    data = pa.table({"id": list(range(200)), "text": [f"t{i}" * 20 for i in range(200)]})
    write_partition(data, "memory://fsync-test/ds", 0, size_limit=2000)
    assert len(memory_bucket("fsync-test")) > 3
    assert not [name for name in synced if ".mds" in name]
    write_partition(data, str(tmp_path / "local"), 0, size_limit=2000)
    assert len([name for name in synced if ".mds" in name]) > 3
    synced.clear()
    write_partition(data, (str(tmp_path / "kept"), "memory://fsync-test/kept"), 0, size_limit=2000, keep_local=True)
    assert len([name for name in synced if ".mds" in name]) > 3
