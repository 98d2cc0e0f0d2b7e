"""Column encodings: round trips, exact byte layouts, type checks and hostile bytes."""

from __future__ import annotations

import contextlib
import struct
import sys
from decimal import Decimal
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from astream._format.encodings import ENCODING_NAMES, encode_value, get_encoding, is_encoding
from astream.errors import AstreamError, EncodingError, MissingExtraError, SampleError

from .strategies import same, values_for

pytest.importorskip("PIL")

SCALARS = ["uint8", "uint16", "uint32", "uint64", "int8", "int16", "int32", "int64", "float16", "float32", "float64"]
ALL = [
    "bytes", "str", "int", *SCALARS, "str_int", "str_float", "str_decimal", "json", "pkl",
    "ndarray", "ndarray:float32", "ndarray:uint16", "ndarray:int16:3,4", "ndarray:uint8:8", "ndarray:float64:2,2,2",
    "pil", "png", "jpeg", "jpeg_array", "jpegarray", "list[pil]", "list[png]", "list[jpeg]",
]
IMAGES = {"pil", "png", "jpeg", "jpeg_array", "jpegarray", "list[pil]", "list[png]", "list[jpeg]"}
FAST = settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.too_slow])
SLOWER = settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])


def test_every_registered_name_is_tested() -> None:
    assert set(ENCODING_NAMES) <= {e.split(":")[0] for e in ALL}


@pytest.mark.parametrize("encoding", ALL)
def test_round_trip(encoding: str) -> None:
    enc = get_encoding(encoding)

    @(SLOWER if encoding in IMAGES else FAST)
    @given(values_for(encoding))
    def check(value: Any) -> None:
        data = enc.encode(value)
        if enc.size is not None:
            assert len(data) == enc.size
        assert same(encoding, value, enc.decode(data))
        assert same(encoding, value, enc.decode(memoryview(data)))

    check()


@pytest.mark.parametrize("encoding", [e for e in ALL if get_encoding(e).batchable])
def test_decode_block_equals_one_by_one(encoding: str) -> None:
    enc = get_encoding(encoding)
    assert enc.size is not None

    @FAST
    @given(st.lists(values_for(encoding), max_size=6))
    def check(values: list[Any]) -> None:
        data = b"".join(enc.encode(v) for v in values)
        block = np.frombuffer(data, np.uint8).reshape(len(values), enc.size)
        batch = enc.decode_block(block)
        assert batch.shape == (len(values), *(enc.shape or ()))
        assert batch.flags.owndata or batch.base is not None
        for k, value in enumerate(values):
            one = enc.decode(enc.encode(value))
            assert np.asarray(one).tobytes() == batch[k].tobytes()
            assert batch[k].dtype == np.asarray(one).dtype

    check()


@pytest.mark.parametrize("encoding", [e for e in ALL if e != "pkl"])
@settings(max_examples=60, deadline=None)
@given(data=st.binary(max_size=80))
def test_random_bytes_never_escape_as_foreign_errors(encoding: str, data: bytes) -> None:
    enc = get_encoding(encoding)
    if enc.size is not None and len(data) != enc.size:
        data = (data * (enc.size // max(1, len(data)) + 1))[: enc.size]  # the layout guarantees the size
    with contextlib.suppress(AstreamError):
        enc.decode(data)


# --- exact bytes, as the format note describes them -------------------------------------


@pytest.mark.parametrize(
    ("encoding", "value", "expected"),
    [
        ("int", -2, struct.pack("<q", -2)),
        ("uint16", 513, b"\x01\x02"),
        ("float32", 1.0, struct.pack("<f", 1.0)),
        ("str", "é", "é".encode()),
        ("str_int", 10**30, b"1000000000000000000000000000000"),
        ("str_float", 0.1, b"0.1"),
        ("str_decimal", Decimal("-1.50"), b"-1.50"),
        ("json", {"b": [1, 2.5, None]}, b'{"b": [1, 2.5, null]}'),
        ("ndarray", np.array([1, 2, 3], np.uint8), bytes([8, (1 << 2) | 0, 3, 1, 2, 3])),
        ("ndarray:int16", np.zeros((2, 300), np.int16), bytes([(2 << 2) | 1]) + struct.pack("<HH", 2, 300) + bytes(1200)),
        ("ndarray:uint8:2,2", np.array([[1, 2], [3, 4]], np.uint8), bytes([1, 2, 3, 4])),
        ("ndarray:uint8", np.asfortranarray(np.array([[1, 2], [3, 4]], np.uint8)), bytes([2 << 2, 2, 2, 1, 2, 3, 4])),
        ("ndarray:int32", np.array([1, 2], ">i4"), bytes([1 << 2, 2]) + struct.pack("<ii", 1, 2)),
        ("jpeg_array", [b"ab", b"c"], struct.pack("<III", 2, 2, 1) + b"abc"),
        ("list[png]", [], struct.pack("<II", 0, 0)),
    ],
)
def test_exact_bytes(encoding: str, value: Any, expected: bytes) -> None:
    assert get_encoding(encoding).encode(value) == expected


def test_pil_layout() -> None:
    from PIL import Image

    image = Image.frombytes("LA", (2, 1), b"\x01\x02\x03\x04")
    assert get_encoding("pil").encode(image) == struct.pack("<III", 2, 1, 2) + b"LA" + b"\x01\x02\x03\x04"


def test_scalars_decode_to_numpy_scalars_and_int_to_python_int() -> None:
    for name in SCALARS:
        value = get_encoding(name).decode(get_encoding(name).encode(1))
        assert type(value) is np.dtype(name).type
    assert type(get_encoding("int").decode(bytes(8))) is int


def test_bytes_values_pass_through_any_encoding() -> None:
    assert encode_value(get_encoding("jpeg"), b"\xff\xd8 raw") == b"\xff\xd8 raw"
    assert encode_value(get_encoding("int"), b"12345678") == b"12345678"


# --- what the writer refuses -----------------------------------------------------------


@pytest.mark.parametrize(
    ("encoding", "value"),
    [
        ("int", 1.5), ("int", "3"), ("int", 2**63), ("uint8", 256), ("uint8", -1), ("int8", 2.0),
        ("float16", 1e6), ("float32", "1"), ("str", 3), ("bytes", "x"),
        ("str_int", True), ("str_int", 1.0), ("str_float", "1.0"), ("str_float", Decimal(1)), ("str_decimal", 1.5),
        ("json", {1j}), ("pkl", lambda: 0),
        ("ndarray", [1, 2]), ("ndarray", np.array(3)), ("ndarray", np.zeros(0)), ("ndarray", np.array([True])),
        ("ndarray", np.array([1 + 1j])), ("ndarray:float32", np.zeros(2, np.float64)),
        ("ndarray:uint8:2,2", np.zeros((2, 3), np.uint8)), ("ndarray:uint8:4", np.zeros((2, 2), np.uint8)),
        ("pil", np.zeros((2, 2))), ("jpeg", "x.jpg"), ("list[png]", "x"), ("jpeg_array", []), ("jpeg_array", "ab"),
    ],
)
def test_wrong_values_raise_sample_error(encoding: str, value: Any) -> None:
    with pytest.raises(SampleError, match=encoding.replace("[", r"\[")):
        get_encoding(encoding).encode(value)


def test_jpeg_of_an_rgba_image_is_a_sample_error() -> None:
    from PIL import Image

    with pytest.raises(SampleError, match="JPEG"):
        get_encoding("jpeg").encode(Image.new("RGBA", (2, 2)))


@pytest.mark.parametrize(
    "spec",
    ["nope", "int:3", "ndarray:bool", "ndarray:float32:0", "ndarray:float32:a", "ndarray:int8:2:3", "list[gif]", "", 7],
)
def test_unknown_or_malformed_encodings(spec: Any) -> None:
    with pytest.raises(EncodingError):
        get_encoding(spec)
    assert not is_encoding(spec)


def test_sizes() -> None:
    assert get_encoding("ndarray:float64:2,2,2").size == 64
    assert get_encoding("ndarray:float64").size is None
    assert get_encoding("int").size == 8
    assert get_encoding("float16").size == 2
    assert not get_encoding("pkl").safe
    assert all(get_encoding(e).safe for e in ALL if e != "pkl")


def test_jpeg_array_of_zero_images_reads_as_empty_list() -> None:
    assert get_encoding("jpeg_array").decode(bytes(4)) == []


def test_images_need_the_image_extra(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "PIL", None)
    with pytest.raises(MissingExtraError, match=r"astream\[image\]"):
        get_encoding("png").decode(b"\x89PNG")
    with pytest.raises(MissingExtraError, match=r"astream\[image\]"):
        get_encoding("pil").encode(object())
