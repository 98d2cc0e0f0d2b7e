"""Datasets written by astream read back by mosaicml-streaming (skipped when it is absent).

mosaicml-streaming pulls in torch, so it is never a dependency of astream or of the
default test set; run these with an interpreter that has it (see docs/bench/peer.md).
"""

from __future__ import annotations

import importlib.util
import io
import sys
import types
import warnings
from decimal import Decimal
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from astream import LocalDataset, MDSWriter

from .strategies import same

pytestmark = [pytest.mark.peer, pytest.mark.filterwarnings("ignore")]

ENCODINGS = {
    "b": "bytes", "s": "str", "i": "int", "u8": "uint8", "u16": "uint16", "u32": "uint32", "u64": "uint64",
    "i8": "int8", "i16": "int16", "i32": "int32", "i64": "int64", "f16": "float16", "f32": "float32",
    "f64": "float64", "si": "str_int", "sf": "str_float", "sd": "str_decimal", "j": "json", "p": "pkl",
    "nd": "ndarray", "ndt": "ndarray:float32", "nds": "ndarray:int16:3,4", "pil": "pil", "png": "png",
    "jpg": "jpeg", "ja": "jpeg_array", "ja2": "jpegarray", "lpil": "list[pil]", "lpng": "list[png]",
    "ljpg": "list[jpeg]",
}
SETTINGS = [(None, ["sha1"]), ("zstd:7", ["xxh64"]), ("gz", ["md5", "xxh3_64"]), ("br:5", ["blake2b"]),
            ("bz2", ["sha256"]), ("snappy", ["xxh128"])]


def _streaming() -> Any:
    if importlib.util.find_spec("streaming") is None:
        pytest.skip("mosaicml-streaming is not installed")
    # Its package __init__ imports streaming.vision, which needs torchvision; nothing here uses it.
    stub = types.ModuleType("streaming.vision")
    stub.__path__ = []
    sys.modules.setdefault("streaming.vision", stub)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import streaming
    return streaming


def _image(rng: np.random.Generator, mode: str) -> Any:
    from PIL import Image

    size = (int(rng.integers(1, 12)), int(rng.integers(1, 12)))
    nbytes = len(Image.new(mode, size).tobytes())
    return Image.frombytes(mode, size, rng.integers(0, 256, nbytes, dtype=np.uint8).tobytes())


def _jpeg_bytes(rng: np.random.Generator) -> bytes:
    out = io.BytesIO()
    _image(rng, "RGB").save(out, format="JPEG")
    return out.getvalue()


def _sample(i: int) -> dict[str, Any]:
    rng = np.random.default_rng(i)
    dtype = ["uint8", "int8", "uint16", "int16", "float16", "uint32", "int32", "float32", "uint64", "int64", "float64"][i % 11]
    return {
        "b": rng.bytes(i % 9), "s": "ü" * (i % 4) + str(i), "i": -(2**63) + i if i % 2 else 2**63 - 1 - i,
        "u8": i % 256, "u16": 65535 - i, "u32": 2**32 - 1 - i, "u64": 2**64 - 1 - i, "i8": -128 + i % 256,
        "i16": -(2**15) + i, "i32": -(2**31) + i, "i64": -(2**63) + i, "f16": float(np.float16(i / 7)),
        "f32": i / 7, "f64": [float("nan"), float("inf"), -0.0, i / 7][i % 4], "si": 10**25 * (-1) ** i + i,
        "sf": i / 9, "sd": Decimal(i) / 8, "j": {"i": i, "l": [1.5, None, "x"]}, "p": (i, {i}, b"z"),
        "nd": (rng.standard_normal((1 + i % 3, 2)) * 100).astype(dtype), "ndt": rng.standard_normal(i % 5 + 1).astype(np.float32),
        "nds": rng.integers(-100, 100, (3, 4)).astype(np.int16), "pil": _image(rng, ["RGB", "L", "RGBA", "I;16"][i % 4]),
        "png": _image(rng, ["RGB", "L", "LA"][i % 3]), "jpg": _image(rng, ["RGB", "L"][i % 2]),
        "ja": [_jpeg_bytes(rng) for _ in range(1 + i % 2)], "ja2": [_jpeg_bytes(rng)],
        "lpil": [_image(rng, "RGB") for _ in range(i % 3)], "lpng": [_image(rng, "L") for _ in range(i % 2)],
        "ljpg": [_image(rng, "RGB") for _ in range(i % 3)],
    }


def _check(encoding: str, written: Any, read: Any, where: str) -> None:
    if encoding in ("float16", "float32", "float64"):
        assert np.array(written, encoding).tobytes() == read.tobytes(), where
    elif encoding in ("jpeg", "list[jpeg]"):
        items = written if isinstance(written, list) else [written]
        got = read if isinstance(read, list) else [read]
        assert [(r.mode, r.size) for r in got] == [(w.mode, w.size) for w in items], where
    elif encoding == "pkl":
        assert read == written, where
    else:
        assert same(encoding, written, read), where


@pytest.mark.parametrize(("compression", "hashes"), SETTINGS, ids=[str(s[0]) for s in SETTINGS])
def test_mosaicml_reads_what_astream_writes(tmp_path: Path, compression: str | None, hashes: list[str]) -> None:
    streaming = _streaming()
    out = tmp_path / "ds"
    samples = [_sample(i) for i in range(24)]
    with MDSWriter(out, ENCODINGS, compression=compression, hashes=hashes, size_limit="16kb") as writer:
        for sample in samples:
            writer.write(sample)
    with LocalDataset(out, allow_unsafe_types=True, validate_hash=hashes[0]) as ours:
        assert ours.num_shards > 1
        assert len(ours) == len(samples)
    if compression is None:
        theirs = streaming.base.LocalDataset(local=str(out))
    else:
        theirs = streaming.StreamingDataset(
            remote=str(out), local=str(tmp_path / "cache"), shuffle=False, batch_size=1,
            validate_hash=hashes[0], allow_unsafe_types=True,
        )
    assert len(theirs) == len(samples)
    for i, sample in enumerate(samples):
        read = theirs[i]
        assert sorted(read) == sorted(ENCODINGS)
        for column, encoding in ENCODINGS.items():
            _check(encoding, sample[column], read[column], f"sample {i}, column {column} ({compression})")


@pytest.mark.parametrize(("fmt", "compression"), [("json", None), ("csv", "zstd"), ("tsv", "gz"), ("xsv", None)])
def test_astream_reads_the_peers_text_formats(tmp_path: Path, fmt: str, compression: str | None) -> None:
    streaming = _streaming()
    from streaming.base.format.json import JSONWriter
    from streaming.base.format.xsv import CSVWriter, TSVWriter, XSVWriter

    writer_cls = {"json": JSONWriter, "csv": CSVWriter, "tsv": TSVWriter, "xsv": XSVWriter}[fmt]
    extra = {"separator": "|"} if fmt == "xsv" else {}
    columns = {"id": "int", "name": "str", "score": "float"}
    with writer_cls(out=str(tmp_path / "ds"), columns=columns, compression=compression, hashes=["xxh64"],
                    size_limit=300, **extra) as writer:
        for i in range(40):
            writer.write({"id": i, "name": f"n{i}ü", "score": i / 7})
    with LocalDataset(tmp_path / "ds", validate_hash="xxh64") as ours:
        assert ours.num_shards > 2
        if compression is None:
            theirs = streaming.base.LocalDataset(local=str(tmp_path / "ds"))
            assert [ours[i] for i in range(len(ours))] == [theirs[i] for i in range(len(theirs))]
        assert [ours[i] for i in range(len(ours))] == [{"id": i, "name": f"n{i}ü", "score": i / 7} for i in range(40)]
