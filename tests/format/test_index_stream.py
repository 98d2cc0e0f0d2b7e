"""index.json parsed entry by entry: the same shards as the whole-document reader, or it
steps aside (Unusual) and the whole-document reader decides, error and all."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from astream._cache.node_index import attach_index
from astream._format.index import Index
from astream._format.index_stream import Unusual, stream_shards
from astream.errors import IndexFormatError

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"
INDEXES = sorted(p for p in FIXTURES.rglob("index.json") if "hostile" not in p.parts)


@pytest.mark.parametrize("path", INDEXES, ids=[p.parent.name for p in INDEXES])
def test_every_recorded_index_streams_to_the_same_shards(path: Path) -> None:
    text = path.read_text()
    assert list(stream_shards(text, str(path))) == list(Index.from_bytes(path.read_bytes(), str(path)).shards)


def _entry(i: int) -> dict[str, object]:
    return {"column_encodings": ["int"], "column_names": ["y"], "column_sizes": [8], "compression": None,
            "format": "mds", "hashes": [], "raw_data": {"basename": f"s{i}.mds", "bytes": 10 + i, "hashes": {}},
            "samples": 3 + i, "size_limit": None, "version": 2, "zip_data": None}


@pytest.mark.parametrize("text", [
    json.dumps({"version": 2, "shards": [_entry(0), _entry(1)]}),
    json.dumps({"shards": [_entry(0), _entry(1)], "version": 2, "extra": {"a": [1, 2]}}, indent=3),
    '\n {  "shards" :[ ' + json.dumps(_entry(0)) + " ,\n" + json.dumps(_entry(1)) + ' ] , "version":2 }\n\t',
    json.dumps({"shards": [], "version": 2}),
])
def test_plain_shapes_stream(text: str) -> None:
    assert list(stream_shards(text, "i.json")) == list(Index.from_bytes(text.encode(), "i.json").shards)


@pytest.mark.parametrize("text", [
    '{"shards": [], "shards": [], "version": 2}',  # a key twice: the general reader keeps the last
    '{"shards": [], "version": 2} []',
    '{"shards": [], "version": 3}',
    '{"version": 2}',
    "[]",
    '{"shards": [' + json.dumps(_entry(0)) + '] "version": 2}',
])
def test_anything_else_steps_aside(text: str) -> None:
    with pytest.raises((Unusual, ValueError)):
        list(stream_shards(text, "i.json"))


def _doc(**change: object) -> dict[str, object]:
    return {"shards": [_entry(0), {**_entry(1), **change}], "version": 2}


@pytest.mark.parametrize("text", [
    json.dumps(_doc(samples=-1)),
    json.dumps(_doc(raw_data={"basename": "/abs.mds", "bytes": 1, "hashes": {}})),
    json.dumps({"shards": [_entry(0)], "version": 3}),
    json.dumps({"shards": [_entry(0)], "shards2": 1}),
    '{"shards": [' + json.dumps(_entry(0)) + ", ",
    '{"shards": [], "version": 2} trailing',
    "",
    '{"shards": [], "shards": [' + json.dumps({**_entry(0), "samples": "x"}) + '], "version": 2}',
])
def test_a_bad_index_fails_with_the_general_readers_error(text: str, tmp_path: Path) -> None:
    path = tmp_path / "index.json"
    path.write_text(text)
    with pytest.raises(IndexFormatError) as expected:
        Index.load(str(path))
    with pytest.raises(IndexFormatError) as got:
        attach_index(str(path))
    assert type(got.value) is type(expected.value)
    assert str(got.value) == str(expected.value)


def test_a_key_given_twice_reads_as_the_general_reader_reads_it(tmp_path: Path) -> None:
    path = tmp_path / "index.json"
    path.write_text('{"shards": [' + json.dumps(_entry(5)) + '], "version": 2, "shards": ['
                    + json.dumps(_entry(0)) + ", " + json.dumps(_entry(1)) + "]}")
    assert list(attach_index(str(path)).shards) == list(Index.load(str(path)).shards)
