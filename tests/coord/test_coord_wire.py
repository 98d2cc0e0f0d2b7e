"""The sans-I/O wire codec: frames, schemas, versions; fuzzed with Hypothesis."""

from __future__ import annotations

import contextlib
import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from astream._coord.wire import (
    HEADER,
    MAGIC,
    PROTOCOL_VERSION,
    FrameDecoder,
    ProtocolError,
    VersionMismatch,
    encode,
    validate_reply,
    validate_request,
)
from astream.errors import CoordinationError

json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**40), 2**40) | st.text(max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
messages = st.dictionaries(st.text(max_size=10), json_values, max_size=6)


@given(st.lists(messages, max_size=5), st.data())
def test_roundtrip_in_any_chunking(batch: list[dict[str, object]], data: st.DataObject) -> None:
    stream = b"".join(encode(m) for m in batch)
    cuts = sorted(data.draw(st.lists(st.integers(0, len(stream)), max_size=8)))
    decoder = FrameDecoder()
    out = []
    for start, end in zip([0, *cuts], [*cuts, len(stream)], strict=True):
        out.extend(decoder.feed(stream[start:end]))
    assert out == batch


@settings(max_examples=300)
@given(st.binary(max_size=200))
def test_garbage_raises_coordination_error_or_waits(garbage: bytes) -> None:
    decoder = FrameDecoder(max_frame=4096)
    try:
        out = decoder.feed(garbage)
    except CoordinationError:
        with pytest.raises(ProtocolError):
            decoder.feed(b"")  # broken for good: the connection must close
        return
    for message in out:
        assert isinstance(message, dict)


def test_bad_magic_and_oversize() -> None:
    with pytest.raises(ProtocolError, match="magic"):
        FrameDecoder().feed(b"GET / HTTP/1.1\r\n")
    with pytest.raises(ProtocolError, match="exceeds"):
        FrameDecoder(max_frame=1024).feed(HEADER.pack(MAGIC, PROTOCOL_VERSION, 2048))
    with pytest.raises(ProtocolError, match="not an object"):
        FrameDecoder().feed(encode([1, 2]))  # type: ignore[arg-type]
    body = b"\xff\xfe"
    with pytest.raises(ProtocolError, match="not JSON"):
        FrameDecoder().feed(HEADER.pack(MAGIC, PROTOCOL_VERSION, len(body)) + body)


def test_other_version_is_a_clear_error() -> None:
    with pytest.raises(VersionMismatch, match=r"v7.*same astream version") as info:
        FrameDecoder().feed(encode({"op": "hello"}, version=7))
    assert info.value.peer_version == 7
    assert isinstance(info.value, CoordinationError)


@pytest.mark.parametrize(
    "message",
    [
        {"op": "ensure", "id": 1, "key": "a", "pin": False},
        {"op": "ensure", "id": 1, "key": "a", "pin": True, "first": True},
        {"op": "prefetch", "keys": ["a", "b"], "first": False},
        {"op": "unpin", "key": "a"},
        {"op": "barrier", "id": 2, "name": "b", "parties": ["x", "y"], "timeout": 1.5},
        {"op": "barrier", "id": 2, "name": "b", "parties": 3, "timeout": 1},
        {"op": "hello", "id": 1, "member": "m", "pid": 5, "epoch_hint": None, "pins": []},
        {"op": "plan", "reader": "r1", "uses": [1 << 32, 3], "starts": [0, 2], "ends": [1, 2], "window": 8,
         "first": True},
        {"op": "plan", "reader": "r1", "uses": [], "starts": [], "ends": [], "window": 8, "first": False},
        {"op": "progress", "reader": "r1", "position": 40},
        {"op": "reader_done", "reader": "r1"},
    ],
)
def test_valid_requests(message: dict[str, object]) -> None:
    assert validate_request(message) is message


@pytest.mark.parametrize(
    "message",
    [
        {"op": "nope", "id": 1},
        {"op": "ensure", "key": "a", "pin": False},
        {"op": "ensure", "id": "1", "key": "a", "pin": False},
        {"op": "ensure", "id": 1, "key": "", "pin": False},
        {"op": "ensure", "id": 1, "key": "a\x00", "pin": False},
        {"op": "ensure", "id": 1, "key": "a", "pin": 1},
        {"op": "ensure_many", "id": 1, "keys": ["a"], "pin": True, "first": 1},
        {"op": "barrier", "id": 2, "name": "b", "parties": ["x", "x"], "timeout": 1},
        {"op": "barrier", "id": 2, "name": "b", "parties": 0, "timeout": 1},
        {"op": "barrier", "id": 2, "name": "b", "parties": 2, "timeout": -1},
        {"op": "hello", "id": 1, "member": "m", "pid": True, "epoch_hint": None, "pins": []},
        {"op": "plan", "reader": "r1", "uses": [-1], "starts": [0], "ends": [0], "window": 8, "first": True},
        {"op": "plan", "reader": "r1", "uses": [True], "starts": [0], "ends": [0], "window": 8, "first": True},
        {"op": "plan", "reader": "r1", "uses": [0] * 16385, "starts": [0], "ends": [0], "window": 8, "first": True},
        {"op": "plan", "reader": "", "uses": [0], "starts": [0], "ends": [0], "window": 8, "first": True},
        {"op": "progress", "reader": "r1", "position": "4"},
    ],
)
def test_invalid_requests(message: dict[str, object]) -> None:
    with pytest.raises(ProtocolError):
        validate_request(message)


@given(messages)
def test_validate_never_crashes(message: dict[str, object]) -> None:
    for validate in (validate_request, validate_reply):
        with contextlib.suppress(ProtocolError):
            validate(message)


def test_frame_layout_is_frozen() -> None:
    frame = encode({"op": "get_epoch", "id": 1})
    assert frame[:4] == b"AS\x01\x00"
    assert int.from_bytes(frame[4:8], "big") == len(frame) - 8
    assert json.loads(frame[8:]) == {"op": "get_epoch", "id": 1}
