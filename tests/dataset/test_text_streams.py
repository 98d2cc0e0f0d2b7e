"""StreamingDataset over MosaicML's text formats (JSONL, CSV, TSV, XSV): the recorded
fixtures from a local folder, astream-written datasets over loopback HTTP with worker
processes and a resume, and malformed rows."""

from __future__ import annotations

import collections
from pathlib import Path
from typing import Any

import pytest

from astream import CSVWriter, JSONWriter, LocalDataset, TSVWriter, XSVWriter
from astream._dataset.dataset import StreamingDataset
from astream._dataset.loader import Loader
from astream._dataset.stream import Stream
from astream.errors import EncodingError
from astream.testing import LoopbackServer

CASES = ["csv_shards_bz2", "csv_unicode", "json_shards_zstd", "json_tiny_limit", "json_unicode",
         "tsv_hashed", "xsv_multichar", "xsv_pipe_br"]
COLUMNS = {"id": "int", "text": "str", "score": "float"}
PER_STREAM = 120


@pytest.mark.parametrize("case", CASES)
def test_recorded_text_datasets_stream_as_local_dataset_reads_them(case: str, fixtures_dir: Path,
                                                                   tmp_path: Path) -> None:
    source = fixtures_dir / "text" / case
    expected = LocalDataset(str(source))
    want = [expected[i] for i in range(len(expected))]
    ds = StreamingDataset(remote=str(source), local=str(tmp_path / "cache"), batch_size=4,
                          validate_hash="xxh128" if case == "tsv_hashed" else None)
    try:
        assert ds.size == len(want)
        assert ds.columns == expected.columns
        assert list(ds) == want
        assert ds[len(want) - 1] == want[-1]
        batch = ds.get_batch([len(want) - 1, 0])
        assert batch == {name: [want[-1][name], want[0][name]] for name in expected.columns}
    finally:
        ds.close()


def _sample(stream: int, i: int) -> dict[str, Any]:
    return {"id": stream * 1000 + i, "text": f"s{stream} é{i}" * (i % 3), "score": i / 8 - 3.0}


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory):
    """One dataset per writer (each compressed differently), served over loopback HTTP."""
    root = tmp_path_factory.mktemp("text-remote")
    writers = [
        lambda out: JSONWriter(out=out, columns=COLUMNS, compression="zstd", size_limit=900),
        lambda out: CSVWriter(out=out, columns=COLUMNS, compression="gz", hashes=["xxh64"], size_limit=700),
        lambda out: TSVWriter(out=out, columns=COLUMNS, size_limit=800),
        lambda out: XSVWriter(out=out, columns=COLUMNS, compression="br", separator="|;", newline="\r\n",
                              size_limit=600),
    ]
    for k, make in enumerate(writers):
        with make(str(root / f"s{k}")) as writer:
            for i in range(PER_STREAM):
                writer.write(_sample(k, i))
    with LoopbackServer(str(root)) as server:
        yield server


def _dataset(server: LoopbackServer, local: Path) -> StreamingDataset:
    streams = [Stream(remote=f"{server.url}/s{k}", local=str(local / f"s{k}")) for k in range(4)]
    return StreamingDataset(streams=streams, shuffle=True, shuffle_seed=3, batch_size=8, validate_hash=None)


def _check_rows(batch: dict[str, Any]) -> list[int]:
    ids = [int(i) for i in batch["id"]]
    for n, sample_id in enumerate(ids):
        want = _sample(sample_id // 1000, sample_id % 1000)
        assert {name: batch[name][n] for name in COLUMNS} == want
    return ids


def test_text_streams_over_http_with_workers_then_resume(served: LoopbackServer, tmp_path: Path) -> None:
    everything = sorted(k * 1000 + i for k in range(4) for i in range(PER_STREAM))
    ds = _dataset(served, tmp_path / "cache")
    loader = Loader(ds, num_workers=2, drop_last=False)
    seen: list[int] = []
    for n, batch in enumerate(loader, start=1):
        seen.extend(_check_rows(batch))
        if n == 7:
            break
    state = loader.state_dict()
    loader.close()
    ds.close()
    # A fresh dataset (another process would do the same), resumed from the state.
    again = _dataset(served, tmp_path / "cache")
    resumed = Loader(again, num_workers=2, drop_last=False)
    resumed.load_state_dict(state)
    rest = [i for batch in resumed for i in _check_rows(batch)]
    resumed.close()
    again.close()
    assert len(seen) == 7 * 8
    counts = collections.Counter(seen + rest)
    assert sorted(counts) == everything
    assert set(counts.values()) == {1}


def _corrupt(path: Path, old: bytes, new: bytes) -> None:
    data = path.read_bytes()
    assert old in data
    assert len(old) == len(new)
    path.write_bytes(data.replace(old, new, 1))


@pytest.mark.parametrize("fmt", ["json", "csv"])
def test_a_malformed_row_names_the_shard_and_sample(fmt: str, tmp_path: Path) -> None:
    remote = tmp_path / "remote"
    make = JSONWriter if fmt == "json" else CSVWriter
    with make(out=str(remote), columns=COLUMNS, size_limit=None) as writer:
        for i in range(20):
            writer.write(_sample(0, i))
    shard = remote / f"shard.00000.{fmt}"
    # Sample 5's line loses what makes it parse (same length, so offsets still agree).
    if fmt == "json":
        _corrupt(shard, b'{"id": 5,', b'{"id": 5;')
    else:
        _corrupt(shard, b"\n5,", b"\n5;")
    ds = StreamingDataset(remote=str(remote), local=str(tmp_path / "cache"), batch_size=4)
    try:
        assert ds[4] == _sample(0, 4)
        with pytest.raises(EncodingError, match=rf"shard\.00000\.{fmt} \(shard 0\), sample 5: cannot decode"):
            ds[5]
        with pytest.raises(EncodingError, match=rf"shard\.00000\.{fmt} \(shard 0\), sample 5"):
            list(ds)
    finally:
        ds.close()
