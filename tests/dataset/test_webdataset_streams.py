"""format='webdataset': tars (plain and gzip) as shards, samples grouped by key, from a local
folder, loopback HTTP (with the written index) and moto's S3 server; resumption and bad input."""

from __future__ import annotations

import collections
import io
import shutil
import tarfile
from pathlib import Path

import pytest

from astream._cache.origin import ORIGIN_NAME
from astream._dataset.dataset import StreamingDataset
from astream._dataset.loader import Loader
from astream.cli import main as cli
from astream.errors import IndexFormatError, ShardFormatError, StateError, UsageError
from astream.testing import LoopbackServer, moto_s3

# (tar name, first key, samples)
TARS = [("shard-000.tar", 0, 120), ("shard-001.tar.gz", 120, 90), ("shard-002.tgz", 210, 75)]
TOTAL = sum(n for *_, n in TARS)


def members(i: int) -> dict[str, bytes]:
    """Sample ``i``'s members by extension (every 9th has no ``jpg``; some are empty)."""
    out = {"cls": str(i).encode(), "meta.json": b'{"i": %d}' % i}
    if i % 9:
        out["jpg"] = bytes([i % 256]) * (i % 40)
    return out


def write_tar(path: Path, first: int, count: int) -> None:
    mode = "w:gz" if path.name.endswith(("gz", "tgz")) else "w"
    with tarfile.open(path, mode) as tar:
        for i in range(first, first + count):
            for ext, data in members(i).items():
                info = tarfile.TarInfo(f"train/{i:06d}.{ext}")
                info.size = len(data)
                tar.addfile(info, io.BytesIO(data))


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    root = tmp_path_factory.mktemp("wds")
    for name, first, count in TARS:
        write_tar(root / name, first, count)
    return root


def _ids(batch: dict[str, list[object]]) -> list[int]:
    out = []
    for k, key in enumerate(batch["__key__"]):
        assert isinstance(key, str)
        i = int(key.rsplit("/", 1)[1])
        want = members(i)
        got = {ext: batch[ext][k] for ext in ("cls", "jpg", "meta.json") if batch[ext][k] is not None}
        assert got == want, key
        out.append(i)
    return out


def test_local_tars_with_workers_every_sample_once(folder: Path, tmp_path: Path) -> None:
    ds = StreamingDataset(remote=str(folder), local=str(tmp_path / "cache"), format="webdataset", shuffle=True,
                          batch_size=16)
    try:
        assert ds.size == TOTAL
        assert ds.columns == {"cls": "bytes", "jpg": "bytes", "meta.json": "bytes"}
        assert ds[125] == {"__key__": "train/000125", **members(125)}
        assert ds[126] == {"__key__": "train/000126", **members(126)}  # a sample without jpg
        seen = [i for batch in Loader(ds, num_workers=2, drop_last=False) for i in _ids(batch)]
        assert sorted(seen) == list(range(TOTAL))
    finally:
        ds.close()


def test_http_with_written_index_then_resume(folder: Path, tmp_path: Path) -> None:
    root = tmp_path / "served"
    shutil.copytree(folder, root)
    with LoopbackServer(str(root)) as server:
        with pytest.raises(UsageError, match="astream index"):
            StreamingDataset(remote=server.url, local=str(tmp_path / "x"), format="webdataset")
        assert cli(["-q", "index", str(root)]) == 0
        assert (root / "index.wds.json").exists()

        def make() -> StreamingDataset:
            return StreamingDataset(remote=server.url, local=str(tmp_path / "cache"), format="webdataset",
                                    shuffle=True, shuffle_seed=3, batch_size=8)

        ds = make()
        loader = Loader(ds, num_workers=2)
        seen: list[int] = []
        for n, batch in enumerate(loader, start=1):
            seen.extend(_ids(batch))
            if n == 9:
                break
        state = loader.state_dict()
        loader.close()
        ds.close()
        again = make()
        resumed = Loader(again, num_workers=2, drop_last=False)
        resumed.load_state_dict(state)
        rest = [i for batch in resumed for i in _ids(batch)]
        resumed.close()
        again.close()
    counts = collections.Counter(seen + rest)
    assert sorted(counts) == list(range(TOTAL))
    assert set(counts.values()) == {1}


def test_s3_prefix_listed(folder: Path, tmp_path: Path) -> None:
    pytest.importorskip("moto.server", reason="moto[server] is not installed")
    with moto_s3("wds-bucket") as client:
        for name, *_ in TARS:
            client.put_object(Bucket="wds-bucket", Key=f"tars/{name}", Body=(folder / name).read_bytes())
        ds = StreamingDataset(remote="s3://wds-bucket/tars", local=str(tmp_path / "cache"), format="webdataset",
                              batch_size=32)
        try:
            assert [i for batch in Loader(ds, drop_last=False) for i in _ids(batch)] == list(range(TOTAL))
            # The copies fetched to scan the headers are the cached tars: nothing crossed twice.
            assert ds.stats().shards_downloaded == 0
            assert sorted(p.name for p in (tmp_path / "cache").iterdir() if p.name.endswith(("tar", "gz"))) == \
                sorted(name for name, *_ in TARS)
        finally:
            ds.close()
        # A bounded cache keeps no copy made before its engine could account for it.
        bounded = StreamingDataset(remote="s3://wds-bucket/tars", local=str(tmp_path / "bounded"),
                                   format="webdataset", batch_size=32, cache_limit="10mb")
        try:
            assert not [p for p in (tmp_path / "bounded").iterdir() if p.name.endswith(("tar", "gz"))]
            assert len([i for batch in Loader(bounded, drop_last=False) for i in _ids(batch)]) == TOTAL
            assert bounded.stats().shards_downloaded == len(TARS)
        finally:
            bounded.close()
        # A tar that is not one: named, and the scans that ended leave no marker or temporary.
        client.put_object(Bucket="wds-bucket", Key="mixed/a.tar", Body=(folder / TARS[0][0]).read_bytes())
        client.put_object(Bucket="wds-bucket", Key="mixed/b.tar", Body=b"not a tar" * 200)
        with pytest.raises(ShardFormatError, match=r"b\.tar: not a tar file"):
            StreamingDataset(remote="s3://wds-bucket/mixed", local=str(tmp_path / "mixed"), format="webdataset")
        assert sorted(p.name for p in (tmp_path / "mixed").iterdir()) == [ORIGIN_NAME, "a.tar"]  # (whose cache)


def test_bad_input_is_named(folder: Path, tmp_path: Path) -> None:
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "broken.tar").write_bytes(b"this is not a tar archive" * 40)
    with pytest.raises(ShardFormatError, match=r"broken\.tar: not a tar file"):
        StreamingDataset(remote=str(bad), local=str(tmp_path / "c1"), format="webdataset")
    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(IndexFormatError, match="no WebDataset tars"):
        StreamingDataset(remote=str(empty), local=str(tmp_path / "c2"), format="webdataset")


def test_a_changed_tar_refuses_an_old_state(tmp_path: Path) -> None:
    root = tmp_path / "data"
    root.mkdir()
    write_tar(root / "a.tar", 0, 50)
    write_tar(root / "b.tar", 50, 50)
    ds = StreamingDataset(remote=str(root), local=str(tmp_path / "cache"), format="webdataset", batch_size=5)
    state = Loader(ds).state_dict()
    ds.close()
    write_tar(root / "b.tar", 50, 60)
    fresh = StreamingDataset(remote=str(root), local=str(tmp_path / "cache"), format="webdataset", batch_size=5)
    try:
        assert fresh.size == 110
        with pytest.raises(StateError):
            fresh.load_state_dict(state)
        assert fresh[109]["__key__"] == "train/000109"
    finally:
        fresh.close()
