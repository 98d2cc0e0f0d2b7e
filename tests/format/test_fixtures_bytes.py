"""Acceptance: astream encodes and writes the same bytes as mosaicml-streaming 0.13."""

from __future__ import annotations

import hashlib
import io
import json
import pickle
from pathlib import Path
from typing import Any

import pytest

from astream import LocalDataset, MDSWriter
from astream._format.compression import get_codec
from astream._format.encodings import encode_value, get_encoding

from .helpers import WITH_EXPECTED, Expected, dataset_root

pytest.importorskip("PIL")

# Lossy or order-dependent encodings: their recorded bytes cannot be rebuilt from the
# decoded values (JPEG re-encoding, set iteration order inside pickles).
_NOT_REBUILDABLE = {"jpeg", "list[jpeg]", "jpeg_array", "jpegarray"}


def _contains_set(tagged: Any) -> bool:
    if isinstance(tagged, dict):
        return tagged.get("t") in ("set", "frozenset") or any(_contains_set(v) for v in tagged.values())
    if isinstance(tagged, list):
        return any(_contains_set(v) for v in tagged)
    return False


# astream writes MDS only; datasets in the peer's other formats are checked by the read tests.
MDS_EXPECTED = [d for d in WITH_EXPECTED if d.get("format", "mds") == "mds"]


@pytest.fixture(scope="module", params=MDS_EXPECTED, ids=lambda d: d["name"])
def recorded(request: pytest.FixtureRequest, mds_dir: Path) -> tuple[LocalDataset, Expected]:
    entry: dict[str, Any] = request.param
    root, split = dataset_root(mds_dir, entry)
    ds = LocalDataset(root, split=split, allow_unsafe_types=True)
    yield ds, Expected(mds_dir, entry)
    ds.close()


def _stored_columns(ds: LocalDataset, i: int) -> dict[str, bytes]:
    shard, offset = ds._locate(i)
    reader = ds.shard(shard)
    record = reader.record(offset)
    spans = reader.layout.split(record, 0)
    return {name: record[a:b] for name, (a, b) in zip(reader.layout.names, spans, strict=True)}


def _rebuilt_sample(ds: LocalDataset, expected: Expected, i: int) -> dict[str, Any]:
    """The sample's values as a user would write them; stored bytes for lossy columns."""
    if expected.columnar:
        return expected.build_sample(i)
    stored = _stored_columns(ds, i)
    sample = {}
    for name, tagged in expected.samples[i]["values"].items():
        encoding = ds.columns[name]
        if encoding in _NOT_REBUILDABLE or (encoding == "pkl" and _contains_set(tagged)):
            sample[name] = stored[name]  # bytes pass through verbatim, whatever the encoding
        else:
            sample[name] = expected.build(tagged)
    return sample


def test_each_column_encodes_to_the_recorded_bytes(recorded: tuple[LocalDataset, Expected]) -> None:
    ds, expected = recorded
    checked = 0
    if expected.columnar:
        for i in range(0, expected.num_samples, 5):
            stored = _stored_columns(ds, i)
            for name, value in expected.build_sample(i).items():
                assert encode_value(get_encoding(ds.columns[name]), value) == stored[name], (i, name)
                checked += 1
    for i, want in enumerate(expected.samples):
        stored = _stored_columns(ds, i)
        for name, tagged in want["values"].items():
            encoding = ds.columns[name]
            if encoding in _NOT_REBUILDABLE:
                continue
            data = encode_value(get_encoding(encoding), expected.build(tagged))
            if encoding == "pkl" and _contains_set(tagged):
                # Set order inside a pickle depends on insertion history; the value must still match.
                assert pickle.loads(data) == pickle.loads(stored[name])
                continue
            assert data == stored[name], f"{expected.entry['name']}[{i}].{name}"
            checked += 1
    assert checked > 0


def test_each_record_hashes_to_raw_sha1(recorded: tuple[LocalDataset, Expected]) -> None:
    ds, expected = recorded
    if expected.columnar:
        pytest.skip("column-wise expected values carry no record digests")
    layout = ds.shard(0).layout
    for i, want in enumerate(expected.samples):
        record = layout.encode(_rebuilt_sample(ds, expected, i), i)
        assert hashlib.sha1(record).hexdigest() == want["raw_sha1"], f"{expected.entry['name']}[{i}]"


def test_rewritten_dataset_is_identical(recorded: tuple[LocalDataset, Expected], tmp_path: Path) -> None:
    ds, expected = recorded
    first = ds.index.shards[0]
    out = tmp_path / "ds"
    with MDSWriter(out, dict(ds.columns), compression=first.compression, hashes=list(first.hashes),
                   size_limit=first.size_limit) as writer:
        for i in range(len(ds)):
            writer.write(_rebuilt_sample(ds, expected, i))
    ours = json.loads((out / "index.json").read_text())
    theirs = json.loads((Path(ds.root) / "index.json").read_text())
    for shard in (*ours["shards"], *theirs["shards"]):
        if shard["zip_data"] is not None:  # compressor libraries differ; only names must agree
            shard["zip_data"] = shard["zip_data"]["basename"]
    assert ours == theirs
    for info in ds.index.shards:
        if info.zip_data is None:
            assert (out / info.raw_data.basename).read_bytes() == (Path(ds.root) / info.raw_data.basename).read_bytes()
        else:
            assert not (out / info.raw_data.basename).exists()  # only the compressed file is kept
            codec = get_codec(info.compression or "")
            size = info.raw_data.bytes
            raw = codec.decompress((out / info.zip_data.basename).read_bytes(), size=size)
            assert raw == codec.decompress((Path(ds.root) / info.zip_data.basename).read_bytes(), size=size)


def test_index_json_round_trips_byte_for_byte(recorded: tuple[LocalDataset, Expected]) -> None:
    ds, _ = recorded
    assert ds.index.dumps() == (Path(ds.root) / "index.json").read_bytes()


def test_jpeg_from_an_existing_file_is_copied_not_reencoded(tmp_path: Path) -> None:
    from PIL import Image

    path = tmp_path / "x.jpg"
    Image.new("RGB", (9, 7), (200, 10, 30)).save(path, quality=93)
    with Image.open(path) as opened:
        assert encode_value(get_encoding("jpeg"), opened) == path.read_bytes()
        path.unlink()
        out = io.BytesIO()
        opened.save(out, format="JPEG")  # the file is gone: re-encoded at Pillow's defaults
        assert encode_value(get_encoding("jpeg"), opened) == out.getvalue()
