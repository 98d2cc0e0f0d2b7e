"""Every codec decodes in bounded steps that stop at the declared size (StreamDecoder, which
the one-shot Codec.decompress runs too): same bytes as the codec's own library, any split
of the input, several members/streams, and clear errors for truncated, short or long input."""

from __future__ import annotations

import bz2
import functools
import gzip
import os

import pytest
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

from astream._format.compression import WINDOW, get_codec
from astream.errors import CompressionError

CODECS = ["zstd", "gz", "bz2", "br", "snappy"]
DATA = os.urandom(100_000) + bytes(1 << 20) + b"tail" * 1000  # incompressible, then a run


@functools.cache
def _stored(family: str) -> bytes:
    return get_codec(family).compress(DATA)  # br's level 11 takes a second: once per codec


def _decode(family: str, stored: bytes, limit: int | None, step: int) -> tuple[bytes, int]:
    out = bytearray()
    largest = [0]

    def emit(piece: bytes | bytearray | memoryview) -> None:
        largest[0] = max(largest[0], len(piece))
        out.extend(piece)

    decoder = get_codec(family).stream_decoder(emit, limit, "s.mds")
    for at in range(0, len(stored), step):
        decoder.decode(stored[at : at + step])
    decoder.flush()
    return bytes(out), largest[0]


@pytest.mark.parametrize("family", CODECS)
@pytest.mark.parametrize("step", [1 << 30, 4 << 20, 7777])
def test_same_bytes_in_bounded_windows(family: str, step: int) -> None:
    stored = _stored(family)
    out, largest = _decode(family, stored, len(DATA), step)
    assert out == DATA
    if family != "snappy":  # one raw block: decoded whole, and never over its declared size
        assert largest <= 2 * WINDOW  # br may pass its bound by a block
    assert get_codec(family).decompress(stored, size=len(DATA), name="s") == DATA


@pytest.mark.parametrize("family", CODECS)
def test_a_size_other_than_declared_is_refused(family: str) -> None:
    codec = get_codec(family)
    stored = _stored(family)
    with pytest.raises(CompressionError, match=r"s\.mds: .*(more than the \d+ bytes|snappy block of)"):
        codec.decompress(stored, size=len(DATA) - 1, name="s.mds")
    with pytest.raises(CompressionError, match=rf"s\.mds: decompresses to {len(DATA)} bytes, index.json says"):
        codec.decompress(stored, size=len(DATA) + 1, name="s.mds")
    with pytest.raises(CompressionError, match=r"s\.mds"):
        codec.decompress(stored[: len(stored) // 2], size=len(DATA), name="s.mds")


def test_several_members_and_streams() -> None:
    # Members longer than a window: each member's end hands the rest of the input on whole.
    parts = [os.urandom(300_000), bytes(1 << 20), b"x"]
    joined = b"".join(parts)
    gz = b"".join(gzip.compress(p) for p in parts) + bytes(10)  # gzip's rule: zero padding after
    assert _decode("gz", gz, len(joined), 5000)[0] == joined == gzip.decompress(gz)
    bz = b"".join(bz2.compress(p) for p in parts) + b"not a stream"  # bz2's rule: ignored
    assert _decode("bz2", bz, len(joined), 5000)[0] == joined == bz2.decompress(bz)
    frames = [get_codec("zstd").compress(p) for p in parts]  # the first frame's size is not the whole's
    assert get_codec("zstd").decompress(b"".join(frames), size=len(joined)) == joined
    assert get_codec("zstd").decompress(frames[0], size=len(parts[0])) == parts[0]  # one frame: one call


@settings(max_examples=30, deadline=None)
@given(st.sampled_from(CODECS), st.binary(max_size=3000), st.integers(1, 500))
def test_any_bytes_any_split(family: str, data: bytes, step: int) -> None:
    stored = get_codec(family).compress(data)
    assert _decode(family, stored, len(data), step)[0] == data


def test_zstd_window_no_larger_than_the_output_needs() -> None:
    params = zstandard.ZstdCompressionParameters.from_level(19, window_log=27)
    writer = zstandard.ZstdCompressor(compression_params=params).compressobj()
    stored = writer.compress(b"small") + writer.flush()  # asks the decoder for a 128 MiB window
    with pytest.raises(CompressionError, match="too much memory"):
        get_codec("zstd").decompress(stored, size=5, name="s")


def test_a_snappy_block_is_refused_by_its_length() -> None:
    stored = get_codec("snappy").compress(bytes(10_000))
    with pytest.raises(CompressionError, match=r"a snappy block of 10000 bytes, index\.json records 100"):
        get_codec("snappy").stream_decoder(lambda _: None, 100, "s").decode(stored[:3])  # from its first bytes
