"""MosaicML Streaming's documented idioms, end to end against astream (issue 31, item 7).

Each test is written from MosaicML 0.13's documentation and behaviour: what a migrating
script does with only its imports changed, and what it gets. Where astream does not do
what MosaicML does, the test checks the error names the replacement (docs/migration.md
lists each).
"""

from __future__ import annotations

import json
import pickle
import subprocess
import sys
import warnings
from pathlib import Path

import numpy as np
import pytest

from astream import (
    CSVWriter,
    JSONWriter,
    Loader,
    LocalDataset,
    MDSWriter,
    Stream,
    StreamingDataset,
    TSVWriter,
    XSVWriter,
)
from astream.errors import (
    ConfigError,
    IndexFormatError,
    IndexJSONError,
    OutputExistsError,
    RemoteNotFoundError,
    SampleIndexError,
)
from astream.testing import LoopbackServer

N = 120


def _write(out: Path, n: int = N, name: str = "") -> Path:
    with MDSWriter(out=str(out), columns={"id": "int", "name": "str"}, size_limit=256) as writer:
        for i in range(n):
            writer.write({"id": i, "name": f"{name}{i}"})
    return out


@pytest.fixture(scope="module")
def data(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return _write(tmp_path_factory.mktemp("idioms") / "ds")


def _ids(samples: list) -> list:
    return [_ids(s) if isinstance(s, list) else int(s["id"]) for s in samples]


# -- ds[...] -----------------------------------------------------------------------------------

@pytest.mark.parametrize("kind", ["streaming", "local"])
def test_fancy_indexing_returns_lists_of_samples(data: Path, kind: str) -> None:
    ds = StreamingDataset(local=str(data), batch_size=4) if kind == "streaming" else LocalDataset(str(data))
    assert _ids(ds[[17, 44]]) == [17, 44]
    assert _ids(ds[0:29:3]) == list(range(0, 29, 3))
    assert _ids(ds[np.arange(10)]) == list(range(10))
    assert _ids(ds[np.array([[1, 2], [3, 4]])]) == [[1, 2], [3, 4]]
    assert _ids(ds[[[5], [6, -1]]]) == [[5], [6, N - 1]]
    assert _ids(ds[::-40]) == [119, 79, 39]
    assert _ids(ds[N - 2 : N + 5]) == [N - 2, N - 1]  # a slice clips, as Python's does
    assert int(ds[np.int64(3)]["id"]) == 3
    with pytest.raises(SampleIndexError):
        ds[[1, N]]
    with pytest.raises(ConfigError, match="0-d array"):
        ds[np.array(3)]


def test_fancy_indexing_goes_through_the_transform_and_a_subclass(data: Path) -> None:
    ds = StreamingDataset(local=str(data), batch_size=4, transform=lambda s: {**s, "twice": 2 * int(s["id"])})
    assert [s["twice"] for s in ds[[3, 4]]] == [6, 8]
    with pytest.raises(ConfigError, match=r"sample index must be an int \(or, for ds\[\.\.\.\], a slice"):
        ds[(1, 2)]


# -- Stream weights ----------------------------------------------------------------------------

def test_streams_hold_their_resolved_weights_after_the_dataset_is_built(tmp_path: Path) -> None:
    # The docs' example: A has 100 samples, B 200; proportions 0.25 and 0.75 of 300.
    a, b = _write(tmp_path / "a", 100, "a"), _write(tmp_path / "b", 200, "b")
    stream_a = Stream(local=str(a), proportion=0.25)
    stream_b = Stream(local=str(b), proportion=0.75)
    ds = StreamingDataset(streams=[stream_a, stream_b], batch_size=4)
    assert (stream_a.proportion, stream_a.repeat, stream_a.choose) == (0.25, 0.75, 75)
    assert (stream_b.proportion, stream_b.repeat, stream_b.choose) == (0.75, 1.125, 225)
    assert [(s.proportion, s.repeat, s.choose) for s in ds.streams] == [(0.25, 0.75, 75), (0.75, 1.125, 225)]
    # The same streams make another dataset, from the weights they were given.
    assert stream_a.given() == (0.25, None, None)
    ds2 = StreamingDataset(streams=[stream_a, stream_b], epoch_size=1000, batch_size=4)
    assert len(ds2) == 1000
    assert (stream_a.choose, stream_b.choose) == (250, 750)

    up = Stream(local=str(a), repeat=2.5)
    few = Stream(local=str(b), choose=50)
    StreamingDataset(streams=[up, few], batch_size=4)
    assert (up.choose, up.repeat, few.choose, few.repeat) == (250, 2.5, 50, 0.25)
    assert up.proportion == pytest.approx(250 / 300)
    (single,) = StreamingDataset(local=str(a), batch_size=4).streams
    assert (single.proportion, single.repeat, single.choose) == (1.0, 1.0, 100)


def test_stream_name_and_stream_config(data: Path) -> None:
    ds = StreamingDataset(local=str(data), batch_size=4, stream_name="stream", stream_config={"repeat": 2})
    assert len(ds) == 2 * N
    assert sorted(int(s["id"]) for s in ds) == sorted(list(range(N)) * 2)
    with pytest.raises(ConfigError, match=r"stream_name='my_stream'.*no registry.*streams=\[astream\.Stream"):
        StreamingDataset(local=str(data), stream_name="my_stream", stream_config={"arg1": "val1"})
    with pytest.raises(ConfigError, match=r"stream_config holds 'remote'.*give remote, local, split"):
        StreamingDataset(local=str(data), stream_config={"remote": "s3://x"})
    with pytest.raises(ConfigError, match="with streams=, give each Stream its own weight"):
        StreamingDataset(streams=[Stream(local=str(data))], stream_config={"repeat": 2})


# -- parameters --------------------------------------------------------------------------------

def test_a_size_given_as_a_digit_string_is_bytes(data: Path, tmp_path: Path) -> None:
    ds = StreamingDataset(remote=str(data), local=str(tmp_path / "cache"), batch_size=4, cache_limit="1048576")
    assert ds.cache_limit == 1 << 20
    assert sorted(int(s["id"]) for s in ds) == list(range(N))
    with MDSWriter(out=str(tmp_path / "w"), columns={"id": "int"}, size_limit="2048") as writer:
        assert writer.size_limit == 2048
    with pytest.raises(ConfigError, match=r"cache_limit='1\.5' is not a size"):
        StreamingDataset(remote=str(data), local=str(tmp_path / "cache"), cache_limit="1.5")


def test_predownload_below_batch_size_warns_as_mosaicml_does(data: Path) -> None:
    with pytest.warns(UserWarning, match=r"predownload < batch_size \(4 < 8\)"):
        ds = StreamingDataset(local=str(data), batch_size=8, predownload=4)
    assert sorted(int(s["id"]) for s in ds) == list(range(N))  # and it still reads
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        StreamingDataset(local=str(data), batch_size=8, predownload=8)
        StreamingDataset(local=str(data), batch_size=8)


def test_a_dataset_without_batch_size_takes_the_loaders(data: Path) -> None:
    # MosaicML refuses to iterate without the dataset's batch_size; astream's Loader gives its
    # own, and the order is the one MosaicML gives a dataset of that batch_size.
    kwargs = {"local": str(data), "shuffle": True, "shuffle_seed": 3}
    mine = [b["id"].tolist() for b in Loader(StreamingDataset(**kwargs), batch_size=8)]
    theirs = [b["id"].tolist() for b in Loader(StreamingDataset(batch_size=8, **kwargs), batch_size=8)]
    assert mine == theirs
    assert sorted(i for batch in mine for i in batch) == list(range(N))
    with pytest.raises(ConfigError, match="batch_size"):
        Loader(StreamingDataset(batch_size=4, **kwargs), batch_size=8)


# -- writers -----------------------------------------------------------------------------------

@pytest.mark.parametrize(("writer", "extra"), [
    (MDSWriter, {}), (JSONWriter, {}), (CSVWriter, {}), (TSVWriter, {}), (XSVWriter, {"separator": "|"}),
])
def test_writers_get_config_is_what_each_shard_entry_repeats(tmp_path: Path, writer: type, extra: dict) -> None:
    with writer(out=str(tmp_path / "ds"), columns={"name": "str", "n": "int"}, hashes=["sha1"], size_limit=200,
                **extra) as w:
        config = w.get_config()
        for i in range(40):
            w.write({"name": f"n{i}", "n": i})
    shards = json.loads((tmp_path / "ds" / "index.json").read_text())["shards"]
    assert len(shards) > 1
    assert config["version"] == 2
    assert config["format"] == w.format
    for shard in shards:
        assert {key: shard[key] for key in config} == config
    config["hashes"].append("md5")
    assert w.get_config()["hashes"] == ["sha1"]  # a copy


def test_a_writer_refuses_a_non_empty_out_with_file_exists_error(tmp_path: Path) -> None:
    out = _write(tmp_path / "ds", 3)
    with pytest.raises(FileExistsError, match="exists and is not empty; pass exist_ok=True"):
        MDSWriter(out=str(out), columns={"id": "int"})
    with pytest.raises(OutputExistsError):
        JSONWriter(out=str(out), columns={"id": "int"})
    with MDSWriter(out=str(out), columns={"id": "int"}, exist_ok=True) as writer:
        writer.write({"id": 7})
    assert [int(s["id"]) for s in LocalDataset(str(out))] == [7]


def test_a_writer_refuses_an_unknown_keyword_with_value_error(tmp_path: Path) -> None:
    with pytest.raises(ValueError, match=r"MDSWriter got unknown argument\(s\) extra_bytes_per_shard, foo; it takes "
                                         r"out, columns, .*keep_local, progress_bar, max_workers"):
        MDSWriter(out=str(tmp_path / "a"), columns={"id": "int"}, foo=1, extra_bytes_per_shard=0)
    with pytest.raises(ConfigError, match="CSVWriter got unknown argument"):
        CSVWriter(out=str(tmp_path / "b"), columns={"id": "int"}, separator=",")
    # What MosaicML's writers take is taken: retry, progress_bar, max_workers, exist_ok.
    with MDSWriter(out=str(tmp_path / "c"), columns={"id": "int"}, retry=4, progress_bar=False, max_workers=2,
                   exist_ok=True) as writer:
        writer.write({"id": 1})
    assert writer._options.retry.retries == 4


# -- index.json --------------------------------------------------------------------------------

@pytest.mark.parametrize("text", ["", "  \n", '{"shards": [', "not json"])
def test_an_empty_or_malformed_index_is_a_json_decode_error(tmp_path: Path, text: str) -> None:
    folder = tmp_path / "ds"
    folder.mkdir()
    (folder / "index.json").write_text(text)
    for make in (lambda: LocalDataset(str(folder)), lambda: StreamingDataset(local=str(folder))):
        with pytest.raises(json.JSONDecodeError) as caught:
            make()
        error = caught.value
        assert isinstance(error, IndexJSONError)
        assert isinstance(error, IndexFormatError)
        assert str(folder / "index.json") in str(error)
        assert ("index.json: empty;" in str(error)) == (not text.strip())
        copy = pickle.loads(pickle.dumps(error))
        assert (type(copy), str(copy), copy.pos, copy.lineno, copy.colno) == (
            type(error), str(error), error.pos, error.lineno, error.colno)


def test_a_malformed_remote_index_is_a_json_decode_error(tmp_path: Path) -> None:
    (tmp_path / "remote").mkdir()
    (tmp_path / "remote" / "index.json").write_text('{"version": 2, "shards": [}')
    with LoopbackServer(str(tmp_path / "remote")) as server, pytest.raises(json.JSONDecodeError):
        StreamingDataset(remote=server.url, local=str(tmp_path / "cache"))


# -- exceptions and imports --------------------------------------------------------------------

def test_exception_classes_are_mosaicmls_builtins(data: Path, tmp_path: Path) -> None:
    # What `except` clauses in MosaicML scripts catch (docs/migration.md: classes are MosaicML's
    # where it has one, messages are astream's).
    ds = StreamingDataset(local=str(data), batch_size=4)
    with pytest.raises(IndexError):
        ds[N]
    with pytest.raises(ValueError, match="shuffle_algo"):
        StreamingDataset(local=str(data), shuffle_algo="nope")
    with pytest.raises(FileNotFoundError):
        StreamingDataset(remote=str(tmp_path / "missing"), local=str(tmp_path / "cache"))
    assert issubclass(RemoteNotFoundError, FileNotFoundError)


def test_streaming_dataloader_names_its_replacement() -> None:
    code = "from astream import StreamingDataLoader"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert result.returncode == 1
    assert "ImportError: astream has no StreamingDataLoader: use astream.Loader(ds, batch_size=B" in result.stderr
    import astream

    assert "StreamingDataLoader" not in dir(astream)
    assert "StreamingDataLoader" not in astream.__all__
