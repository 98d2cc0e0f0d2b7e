"""Reading the peer's other shard formats: JSONL (``json``) and delimited text (``csv``,
``tsv``, ``xsv``).

These "split" shards are two files: the data file holds one text line per sample, and a
``.meta`` file holds uint32 ``n``, ``n + 1`` uint32 offsets into the data file, and the
writer's config as JSON. A JSONL line is ``json.dumps(sample, sort_keys=True)`` plus the
newline and decodes with ``json.loads``; a delimited line is the values rendered with
``str()`` and joined by the separator (no quoting), after a header line of column names.
Columns are ``str``, ``int`` or ``float``.
"""

from __future__ import annotations

import json
import mmap
import struct
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
import numpy.typing as npt

from astream._format.encodings import Buffer
from astream._format.index import ShardInfo
from astream._format.shard import out_of_range
from astream.errors import AstreamError, EncodingError, IndexFormatError, ShardFormatError

__all__ = ["SPLIT_FORMATS", "TextLayout", "TextShardReader"]

SPLIT_FORMATS = ("json", "csv", "tsv", "xsv")
_SEPARATORS = {"csv": ",", "tsv": "\t"}
_CONVERT: dict[str, Callable[[str], Any]] = {"str": str, "int": int, "float": float}
_U32 = np.dtype("<u4")
_OFFSET = struct.Struct("<I")


class TextLayout:
    """The columns of a JSONL or delimited-text shard, and how to turn a line into a sample."""

    def __init__(self, info: ShardInfo, source: str) -> None:
        where = f"{source}: shard {info.index} ({info.raw_data.basename})"
        self.format = info.format
        self.names = info.column_names
        self.specs = info.column_encodings
        for name, spec in zip(self.names, self.specs, strict=True):
            if spec not in _CONVERT:
                raise EncodingError(
                    f"{where}, column {name!r}: encoding {spec!r} is not one of str, int, float "
                    f"(the encodings of the {info.format!r} format)"
                )
        newline = info.config.get("newline", "\n")
        separator = info.config.get("separator", _SEPARATORS.get(info.format))
        if not isinstance(newline, str) or not newline:
            raise IndexFormatError(f"{where}: newline must be a non-empty string, got {newline!r}")
        if info.format != "json" and (not isinstance(separator, str) or not separator):
            raise IndexFormatError(f"{where}: separator must be a non-empty string, got {separator!r}")
        self.newline = newline
        self.separator = separator if isinstance(separator, str) else ""
        self._converters = [_CONVERT[spec] for spec in self.specs]

    def same_columns(self, other: object) -> bool:
        """True if ``other`` stores the same columns with the same encodings."""
        return isinstance(other, TextLayout) and (self.names, self.specs) == (other.names, other.specs)

    def decode(self, data: Buffer) -> dict[str, Any]:
        """Turn one line (with its newline) into a sample.

        Raises:
            ValueError: the line is not valid for this layout (the reader adds context).
        """
        text = str(data, "utf-8")
        if not text.endswith(self.newline):
            raise ValueError(f"the line does not end with the newline {self.newline!r}")
        text = text[: -len(self.newline)]
        if self.format == "json":
            sample = json.loads(text)
            if not isinstance(sample, dict):
                raise ValueError(f"a JSONL line must hold an object, got {type(sample).__name__}")
            return sample
        parts = text.split(self.separator)
        if len(parts) != len(self.names):
            raise ValueError(f"{len(parts)} fields for {len(self.names)} columns")
        return {name: convert(part) for name, convert, part in zip(self.names, self._converters, parts, strict=True)}


class TextShardReader:
    """Random access to the samples of one JSONL or delimited-text shard.

    Args:
        meta: the whole uncompressed ``.meta`` file.
        data: the whole uncompressed data file.
        layout: the shard's columns.
        name: the data file's name, for error messages.
        shard: the shard's position in index.json.
        expected_samples: the sample count index.json records (checked), or None.

    Raises:
        ShardFormatError: the meta file is truncated or its offsets are inconsistent.
    """

    def __init__(
        self, meta: bytes | bytearray | mmap.mmap, data: bytes | bytearray | mmap.mmap, layout: TextLayout, *, name: str = "<shard>",
        shard: int = 0, expected_samples: int | None = None,
    ) -> None:
        self.layout = layout
        self.name = name
        self.shard = shard
        self._meta = meta
        self._data = data
        self._view = memoryview(data)
        size = len(meta)
        if size < 4:
            raise self._fail(f"the meta file has {size} bytes, too few for a header")
        n: int = _OFFSET.unpack_from(meta, 0)[0]
        if expected_samples is not None and n != expected_samples:
            raise self._fail(f"the shard holds {n} samples but index.json says {expected_samples}")
        if 4 + 4 * (n + 1) > size:
            raise self._fail(f"{n} samples need a {4 + 4 * (n + 1)}-byte offset table, the meta file has {size} bytes")
        offsets = np.frombuffer(meta, _U32, n + 1, 4).astype(np.int64)
        bad = np.flatnonzero(np.diff(offsets) < 0)
        if bad.size:
            raise self._fail("offsets go backwards", int(bad[0]))
        if offsets[-1] > len(data):
            k = int(np.argmax(offsets > len(data)))
            raise self._fail(f"the sample ends past the end of the {len(data)}-byte data file", max(k - 1, 0))
        self.num_samples = n
        self._offsets = offsets

    def _fail(self, what: str, sample: int | None = None) -> ShardFormatError:
        where = f"{self.name} (shard {self.shard})" + ("" if sample is None else f", sample {sample}")
        return ShardFormatError(f"{where}: {what}; the file is corrupt or truncated: delete it so it is fetched again")

    def __len__(self) -> int:
        return self.num_samples

    @property
    def nbytes(self) -> int:
        """Size of the uncompressed data file in bytes."""
        return len(self._data)

    @property
    def buffer(self) -> bytes | bytearray | mmap.mmap:
        """The data file's buffer (its pages are what reading touches)."""
        return self._data

    def record(self, index: int) -> bytes:
        """The raw bytes of sample ``index`` in the data file (its line)."""
        i = self._check(index)
        return bytes(self._view[self._offsets[i] : self._offsets[i + 1]])

    def _check(self, index: int) -> int:
        if not -self.num_samples <= index < self.num_samples:
            raise out_of_range(f"{self.name} (shard {self.shard})", index, self.num_samples)
        return index % self.num_samples if index < 0 else index

    def get(self, index: int) -> dict[str, Any]:
        """Decode sample ``index`` (negative counts from the end).

        Raises:
            ConfigError: the index is out of range.
            EncodingError: the line does not decode (names the shard and sample).
        """
        i = self._check(index)
        try:
            return self.layout.decode(self._view[self._offsets[i] : self._offsets[i + 1]])
        except AstreamError:
            raise
        except Exception as exc:
            raise EncodingError(
                f"{self.name} (shard {self.shard}), sample {i}: cannot decode the {self.layout.format!r} line "
                f"({type(exc).__name__}: {exc}); the shard is corrupt: delete it so it is fetched again"
            ) from exc

    def get_batch(self, ids: Sequence[int] | npt.NDArray[np.integer[Any]]) -> dict[str, Any]:
        """Decode many samples; every column comes back as a list in the order of ``ids``."""
        samples = [self.get(int(i)) for i in np.asarray(ids, dtype=np.int64).reshape(-1)]
        return {name: [s.get(name) for s in samples] for name in self.layout.names}

    def close(self) -> None:
        """Release the buffers (unmaps mmaps). Idempotent."""
        view, self._view = self._view, memoryview(b"")
        try:
            view.release()
            for buf in (self._meta, self._data):
                if isinstance(buf, mmap.mmap):
                    buf.close()
        except BufferError:
            pass

    def __enter__(self) -> TextShardReader:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()
