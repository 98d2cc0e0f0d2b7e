"""JSONWriter / CSVWriter / TSVWriter / XSVWriter: the peer's bytes, read back, bad input refused.

tests/fixtures/text/ holds datasets mosaicml-streaming 0.13 wrote (tests/fixtures/record_text.py);
``manifest.json`` there has each case's writer, arguments and samples, so the same input is
written here and compared file by file, index.json included.
"""

from __future__ import annotations

import json
import math
import random
from pathlib import Path
from typing import Any

import pytest

import astream
from astream import CSVWriter, JSONWriter, LocalDataset, TSVWriter, XSVWriter
from astream._format import text_writer
from astream.errors import ConfigError, EncodingError, SampleError

TEXT = Path(__file__).resolve().parents[1] / "fixtures" / "text"
MANIFEST: dict[str, Any] = json.loads((TEXT / "manifest.json").read_text(encoding="utf-8")) if (TEXT / "manifest.json").is_file() else {"cases": []}
CASES = {case["name"]: case for case in MANIFEST["cases"]}


def _files(root: Path) -> dict[str, bytes]:
    return {p.name: p.read_bytes() for p in sorted(root.iterdir())}


def _write(case: dict[str, Any], out: Path, cls: type | None = None) -> Path:
    writer_cls = cls or getattr(astream, case["writer"])
    with writer_cls(out, case["columns"], **case["kwargs"]) as writer:
        for sample in case["samples"]:
            writer.write(sample)
    return out


def test_the_recorded_cases_cover_what_they_should() -> None:
    kinds = {case["writer"] for case in CASES.values()}
    assert kinds == {"JSONWriter", "CSVWriter", "TSVWriter", "XSVWriter"}
    assert any(case["kwargs"].get("compression") for case in CASES.values())
    assert any(case["kwargs"].get("hashes") for case in CASES.values())
    assert sum(len(json.loads((TEXT / n / "index.json").read_text())["shards"]) > 2 for n in CASES) >= 3


@pytest.mark.parametrize("name", sorted(CASES))
def test_writes_the_peers_bytes(tmp_path: Path, name: str) -> None:
    ours = _files(_write(CASES[name], tmp_path / name))
    theirs = _files(TEXT / name)
    assert sorted(ours) == sorted(theirs)
    for file, data in theirs.items():
        assert ours[file] == data, f"{name}/{file}"


@pytest.mark.parametrize("name", ["json_unicode", "csv_shards_bz2"])
def test_the_format_layer_writer_writes_the_same_bytes(tmp_path: Path, name: str) -> None:
    case = CASES[name]
    local_cls = getattr(text_writer, case["writer"])  # no upload layer above it
    assert _files(_write(case, tmp_path / name, local_cls)) == _files(TEXT / name)


def _same(a: Any, b: Any) -> bool:
    return (isinstance(a, float) and isinstance(b, float) and math.isnan(a) and math.isnan(b)) or a == b


@pytest.mark.parametrize("name", sorted(CASES))
def test_round_trips_through_local_dataset(tmp_path: Path, name: str) -> None:
    case = CASES[name]
    hashes = case["kwargs"].get("hashes") or [None]
    ds = LocalDataset(_write(case, tmp_path / name), validate_hash=hashes[0])
    assert len(ds) == len(case["samples"])
    for i, want in enumerate(case["samples"]):
        got = ds[i]
        assert set(got) == set(case["columns"])
        assert all(_same(got[k], want[k]) and type(got[k]) is type(want[k]) for k in want), (i, got, want)
    assert ds.columns == {k: case["columns"][k] for k in sorted(case["columns"])}


def test_random_samples_round_trip(tmp_path: Path) -> None:
    rng = random.Random(7)
    alphabet = "ab ,;\t:é日🎉\"'\\"
    samples = [{"s": "".join(rng.choice(alphabet) for _ in range(rng.randrange(12))),
                "i": rng.randrange(-(10**30), 10**30), "f": rng.uniform(-1e300, 1e300)} for _ in range(200)]
    columns = {"s": "str", "i": "int", "f": "float"}
    for cls, kwargs in ((JSONWriter, {}), (XSVWriter, {"separator": "\x1f"})):
        out = tmp_path / cls.__name__
        with cls(out, columns, size_limit=500, compression="zstd", **kwargs) as writer:
            for sample in samples:
                writer.write(sample)
        ds = LocalDataset(out)
        assert ds.num_shards > 3
        assert [ds[i] for i in range(len(ds))] == samples


# --- bad input ----------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("cls", "value", "message"),
    [
        (CSVWriter, "a,b", r"sample 1, column 's': the value 'a,b' holds the separator ','"),
        (TSVWriter, "a\tb", r"sample 1, column 's': the value 'a\\tb' holds the separator '\\t'"),
        (CSVWriter, "two\nlines", r"sample 1, column 's': .* holds the newline '\\n'"),
        (CSVWriter, 3, r"sample 1, column 's': the 'csv' encoding 'str' needs a Python str, got int 3"),
        (JSONWriter, b"x", r"sample 1, column 's': the 'json' encoding 'str' needs a Python str, got bytes"),
    ],
)
def test_a_value_the_format_cannot_hold_is_refused(tmp_path: Path, cls: type, value: Any, message: str) -> None:
    out = tmp_path / "ds"
    with cls(out, {"s": "str", "n": "int"}) as writer:
        writer.write({"s": "fine", "n": 0})
        with pytest.raises(SampleError, match=message):
            writer.write({"s": value, "n": 1})
        writer.write({"s": "also fine", "n": 2})  # nothing of the refused sample was kept
    ds = LocalDataset(out)
    assert [ds[i] for i in range(len(ds))] == [{"s": "fine", "n": 0}, {"s": "also fine", "n": 2}]


@pytest.mark.parametrize("cls", [JSONWriter, CSVWriter])
def test_wrong_number_types_and_missing_columns(tmp_path: Path, cls: type) -> None:
    with cls(tmp_path / "ds", {"n": "int", "x": "float"}) as writer:
        with pytest.raises(SampleError, match=r"sample 0, column 'n'.* needs a Python int, got bool True"):
            writer.write({"n": True, "x": 1.0})
        with pytest.raises(SampleError, match=r"sample 0, column 'x'.* needs a Python float, got int 1"):
            writer.write({"n": 1, "x": 1})
        with pytest.raises(SampleError, match=r"sample 0: missing columns \['x'\], unexpected columns \[\]"):
            writer.write({"n": 1})
        # MosaicML drops a key that is not a column; astream refuses it, as its MDSWriter does.
        with pytest.raises(SampleError, match=r"sample 0: missing columns \[\], unexpected columns \['y'\]"):
            writer.write({"n": 1, "x": 1.0, "y": 2})
        with pytest.raises(SampleError, match=r"sample 0.*cannot be written as (JSON|text)"):
            writer.write({"n": 10**5000, "x": 1.0})  # past Python's int-to-str digit limit
        writer.write({"n": 1, "x": 1.0})
    assert len(LocalDataset(tmp_path / "ds")) == 1


def test_an_error_inside_the_block_leaves_no_index(tmp_path: Path) -> None:
    out = tmp_path / "ds"

    def write_until_a_bad_value() -> None:
        with CSVWriter(out, {"s": "str"}, size_limit=10) as writer:
            for i in range(20):
                writer.write({"s": f"row {i}"})
            writer.write({"s": "a,b"})

    with pytest.raises(SampleError):
        write_until_a_bad_value()
    assert list(out.glob("shard.*.csv"))  # the finished shards are complete on disk...
    assert not (out / "index.json").exists()  # ...but nothing says the dataset is
    assert not list(out.glob("*.tmp"))


@pytest.mark.parametrize(
    ("make", "error", "message"),
    [
        (lambda out: XSVWriter(out, {"a": "str"}, separator=""), ConfigError, "separator must be a non-empty string"),
        (lambda out: XSVWriter(out, {"a|b": "str"}, separator="|"), ConfigError, r"column name 'a\|b' holds the separator"),
        (lambda out: CSVWriter(out, {"a\nb": "str"}), ConfigError, r"column name 'a\\nb' holds the separator"),
        (lambda out: XSVWriter(out, {"a": "str"}, separator="\n"), ConfigError, "must not contain one another"),
        (lambda out: JSONWriter(out, {"a": "str"}, newline=""), ConfigError, "newline must be a non-empty string"),
        (lambda out: JSONWriter(out, {"a": "bytes"}), EncodingError, r"column 'a': encoding 'bytes' is not one of str, int, float"),
        (lambda out: TSVWriter(out, {}), ConfigError, "columns must be a non-empty dict"),
        (lambda out: JSONWriter(out, {"a": "str"}, hashes=["nope"]), ConfigError, "hashes='nope'"),
    ],
)
def test_bad_parameters_are_named_before_anything_is_written(tmp_path: Path, make: Any, error: type, message: str) -> None:
    out = tmp_path / "ds"
    with pytest.raises(error, match=message):
        make(out)
    assert not out.exists()


def test_exist_ok(tmp_path: Path) -> None:
    out = tmp_path / "ds"
    out.mkdir()
    (out / "old").write_text("x")
    with pytest.raises(ConfigError, match="exist_ok=True"):
        JSONWriter(out, {"a": "str"})
    with JSONWriter(out, {"a": "str"}, exist_ok=True) as writer:
        writer.write({"a": "new"})
    assert sorted(p.name for p in out.iterdir()) == ["index.json", "shard.00000.json", "shard.00000.json.meta"]


# --- against the peer itself, when it is installed ---------------------------------------


@pytest.mark.peer
@pytest.mark.filterwarnings("ignore")
@pytest.mark.parametrize("writer", ["JSONWriter", "CSVWriter", "TSVWriter", "XSVWriter"])
def test_same_bytes_as_the_peer_on_random_samples(tmp_path: Path, writer: str) -> None:
    from .test_peer import _streaming

    streaming = _streaming()
    rng = random.Random(writer)
    alphabet = "xyz ;é日🎉\"'\\"
    columns = {"s": "str", "i": "int", "f": "float", "t": "str"}
    samples = [{"s": "".join(rng.choice(alphabet) for _ in range(rng.randrange(20))), "i": rng.randrange(-10**20, 10**20),
                "f": rng.uniform(-1e9, 1e9), "t": ""} for _ in range(150)]
    kwargs: dict[str, Any] = {"compression": "zstd", "hashes": ["md5", "xxh64"], "size_limit": 700}
    if writer == "XSVWriter":
        kwargs["separator"] = "|"
    with getattr(streaming, writer)(out=str(tmp_path / "theirs"), columns=columns, **kwargs) as theirs:
        for sample in samples:
            theirs.write(sample)
    with getattr(astream, writer)(tmp_path / "ours", columns, **kwargs) as ours:
        for sample in samples:
            ours.write(sample)
    assert _files(tmp_path / "ours") == _files(tmp_path / "theirs")
