"""The peer's text formats (JSONL, CSV, TSV, XSV): read by LocalDataset, bad files rejected.

The datasets here are built from the format note (section 3) by a small writer in this
file; test_peer.py checks the same reader against files the peer itself wrote.
"""

from __future__ import annotations

import json
import shutil
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from astream import LocalDataset
from astream._format.compression import get_codec
from astream._format.hashing import hash_bytes
from astream.errors import AstreamError, EncodingError, HashMismatchError, ShardFormatError

COLUMNS = {"id": "int", "name": "str", "score": "float"}
SAMPLES = [{"id": i, "name": f"n{i}é", "score": i / 3} for i in range(23)]


def _info(basename: str, data: bytes, hashes: list[str]) -> dict[str, Any]:
    return {"basename": basename, "bytes": len(data), "hashes": {a: hash_bytes(a, data) for a in hashes}}


def write_text_dataset(
    root: Path, fmt: str, samples: list[dict[str, Any]], sizes: list[int], compression: str | None = None,
    separator: str | None = None, hashes: tuple[str, ...] = ("sha1",),
) -> Path:
    """Write ``samples`` as text shards of ``sizes`` samples each, laid out as the peer does."""
    root.mkdir(parents=True)
    names = sorted(COLUMNS)
    sep = {"csv": ",", "tsv": "\t"}.get(fmt, separator)
    shards, start = [], 0
    for k, size in enumerate(sizes):
        chunk = samples[start : start + size]
        start += size
        if fmt == "json":
            config: dict[str, Any] = {"columns": COLUMNS}
            header = b""
            lines = [(json.dumps({n: s[n] for n in names}, sort_keys=True) + "\n").encode() for s in chunk]
        else:
            assert sep is not None
            config = {"column_encodings": [COLUMNS[n] for n in names], "column_names": names, "separator": sep}
            header = (sep.join(names) + "\n").encode()
            lines = [(sep.join(str(s[n]) for n in names) + "\n").encode() for s in chunk]
        config.update({"compression": compression, "format": fmt, "hashes": list(hashes), "newline": "\n",
                       "size_limit": None, "version": 2})
        data = header + b"".join(lines)
        offsets = len(header) + np.concatenate(([0], np.cumsum([len(line) for line in lines], dtype=np.int64)))
        meta = struct.pack(f"<I{len(offsets)}I", len(chunk), *offsets.tolist()) + json.dumps(config, sort_keys=True).encode()
        base = f"shard.{k:05}.{fmt}"
        entry = {**config, "samples": len(chunk), "raw_data": _info(base, data, list(hashes)),
                 "raw_meta": _info(base + ".meta", meta, list(hashes)), "zip_data": None, "zip_meta": None}
        for key, name, content in (("zip_data", base, data), ("zip_meta", base + ".meta", meta)):
            if compression is None:
                (root / name).write_bytes(content)
            else:
                codec = get_codec(compression)
                stored = codec.compress(content)
                (root / f"{name}.{codec.extension}").write_bytes(stored)
                entry[key] = _info(f"{name}.{codec.extension}", stored, list(hashes))
        shards.append(dict(sorted(entry.items())))
    (root / "index.json").write_text(json.dumps({"shards": shards, "version": 2}, sort_keys=True))
    return root


@pytest.mark.parametrize(("fmt", "separator"), [("json", None), ("csv", None), ("tsv", None), ("xsv", "|")])
@pytest.mark.parametrize("compression", [None, "zstd"])
def test_text_formats_read_back(tmp_path: Path, fmt: str, separator: str | None, compression: str | None) -> None:
    root = write_text_dataset(tmp_path / "ds", fmt, SAMPLES, [5, 0, 11, 7], compression, separator)
    with LocalDataset(root, validate_hash="sha1") as ds:
        assert len(ds) == 23
        assert ds.columns == {"id": "int", "name": "str", "score": "float"}
        assert [ds[i] for i in range(23)] == SAMPLES
        assert ds[-1] == SAMPLES[-1]
        ids = [22, 0, 9, 9]
        batch = ds.get_batch(ids)
        assert batch == {name: [SAMPLES[i][name] for i in ids] for name in COLUMNS}
        assert ds.shard(2).record(0) == (
            (json.dumps(SAMPLES[5], sort_keys=True) + "\n").encode() if fmt == "json"
            else ((separator or {"csv": ",", "tsv": "\t"}[fmt]).join(str(SAMPLES[5][n]) for n in sorted(COLUMNS)) + "\n").encode()
        )


def test_hash_of_the_meta_file_is_checked(tmp_path: Path) -> None:
    root = write_text_dataset(tmp_path / "ds", "csv", SAMPLES, [23])
    meta = root / "shard.00000.csv.meta"
    data = bytearray(meta.read_bytes())
    data[-1] ^= 1  # the config text: offsets still fine, only the digest notices
    meta.write_bytes(bytes(data))
    with LocalDataset(root, validate_hash="sha1") as ds, pytest.raises(HashMismatchError, match=r"shard\.00000\.csv\.meta"):
        ds[0]


def test_offsets_past_the_data_file(tmp_path: Path) -> None:
    root = write_text_dataset(tmp_path / "ds", "tsv", SAMPLES, [23])
    data = root / "shard.00000.tsv"
    content = data.read_bytes()[:-10]
    data.write_bytes(content)
    index = json.loads((root / "index.json").read_text())
    index["shards"][0]["raw_data"]["bytes"] = len(content)
    (root / "index.json").write_text(json.dumps(index))
    with LocalDataset(root) as ds, pytest.raises(ShardFormatError, match=r"sample 22: the sample ends past the end"):
        ds[0]


def test_count_disagreeing_with_index(tmp_path: Path) -> None:
    root = write_text_dataset(tmp_path / "ds", "json", SAMPLES, [23])
    index = json.loads((root / "index.json").read_text())
    index["shards"][0]["samples"] = 24
    (root / "index.json").write_text(json.dumps(index))
    with LocalDataset(root) as ds, pytest.raises(ShardFormatError, match=r"holds 23 samples but index\.json says 24"):
        ds.shard(0)


def test_a_bad_line_names_the_sample(tmp_path: Path) -> None:
    samples = [*SAMPLES[:3], {"id": "x", "name": "n", "score": 1.0}]  # "x" in an int column
    root = write_text_dataset(tmp_path / "ds", "csv", samples, [4])
    with LocalDataset(root) as ds:
        assert ds[2]["id"] == 2
        with pytest.raises(EncodingError, match=r"shard\.00000\.csv \(shard 0\), sample 3: .*invalid literal"):
            ds[3]


def test_text_columns_take_str_int_float_only(tmp_path: Path) -> None:
    root = write_text_dataset(tmp_path / "ds", "csv", SAMPLES, [23])
    index = json.loads((root / "index.json").read_text())
    index["shards"][0]["column_encodings"] = ["int", "bytes", "float"]
    (root / "index.json").write_text(json.dumps(index))
    with pytest.raises(EncodingError, match="column 'name': encoding 'bytes' is not one of str, int, float"):
        LocalDataset(root)


@pytest.fixture(scope="module", params=["json", "csv"])
def text_dataset(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory) -> Path:
    return write_text_dataset(tmp_path_factory.mktemp("text") / "ds", request.param, SAMPLES, [23], hashes=())


@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(changes=st.lists(st.tuples(st.booleans(), st.integers(0, 10**5), st.integers(0, 255)), min_size=1, max_size=4))
def test_mutated_text_shards_raise_only_astream_errors(
    text_dataset: Path, tmp_path_factory: pytest.TempPathFactory, changes: list[tuple[bool, int, int]]
) -> None:
    copy = Path(shutil.copytree(text_dataset, tmp_path_factory.mktemp("tmut") / "ds"))
    data_file, meta_file = sorted(copy.glob("shard.00000.*"))[0], sorted(copy.glob("shard.00000.*.meta"))[0]
    contents = {data_file: bytearray(data_file.read_bytes()), meta_file: bytearray(meta_file.read_bytes())}
    for in_meta, pos, value in changes:
        buf = contents[meta_file if in_meta else data_file]
        buf[pos % len(buf)] = value
    for path, buf in contents.items():
        path.write_bytes(bytes(buf))
    try:
        with LocalDataset(copy) as ds:
            [ds[i] for i in range(len(ds))]
            ds.get_batch(list(range(len(ds))))
    except AstreamError:
        pass
