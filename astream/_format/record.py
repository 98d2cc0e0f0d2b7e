"""The byte layout of one sample record, shared by the writer and the shard reader.

A record is a head of one uint32 length per variable-size column, then every
column's bytes, in column order (sorted names). Fixed-size columns have no head
entry. :class:`RecordLayout` encodes a sample dict into a record and splits a
record back into its columns.
"""

from __future__ import annotations

import struct
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from astream._format.encodings import Buffer, Encoding, get_encoding
from astream._format.index import ShardInfo
from astream.errors import AstreamError, EncodingError, IndexFormatError, SampleError, UnsafeTypeError

__all__ = ["RecordLayout"]


class RecordLayout:
    """Columns of a shard in storage order, with their encodings.

    Attributes:
        names: column names in the order their bytes appear (MDS sorts them).
        specs: the encoding strings as index.json stores them.
        encodings: the parsed encodings.
        sizes: each column's fixed size, or None for variable-size columns.
        num_var: how many columns have a head entry.
        fixed_size: the total size of the fixed-size columns.
    """

    def __init__(self, names: Sequence[str], specs: Sequence[str], encodings: Sequence[Encoding]) -> None:
        self.names = tuple(names)
        self.specs = tuple(specs)
        self.encodings = tuple(encodings)
        self.sizes = tuple(e.size for e in self.encodings)
        self.num_var = sum(s is None for s in self.sizes)
        self.fixed_size = sum(s for s in self.sizes if s is not None)
        self._head = struct.Struct(f"<{self.num_var}I")
        # Per column: (name, decoder, fixed size or -1, index into the head or -1), so the
        # per-sample loop does no attribute lookups.
        plan: list[tuple[str, Callable[[Buffer], Any], int, int]] = []
        var = 0
        for name, enc, size in zip(self.names, self.encodings, self.sizes, strict=True):
            if size is None:
                plan.append((name, enc.decode_unchecked, -1, var))
                var += 1
            else:
                plan.append((name, enc.decode_unchecked, size, -1))
        self._plan = tuple(plan)
        self._encoders = tuple(
            (name, enc.encode, -1 if size is None else size)
            for name, enc, size in zip(self.names, self.encodings, self.sizes, strict=True)
        )

    @classmethod
    def from_columns(cls, columns: Mapping[str, str]) -> RecordLayout:
        """A layout for writer columns ``{name: encoding}`` (stored in sorted name order).

        Raises:
            EncodingError: an encoding string is unknown or malformed (names the column).
        """
        names = tuple(sorted(columns))
        encodings = []
        for name in names:
            try:
                encodings.append(get_encoding(columns[name]))
            except EncodingError as exc:
                raise EncodingError(f"column {name!r}: {exc}") from None
        return cls(names, tuple(columns[n] for n in names), tuple(encodings))

    @classmethod
    def from_shard(cls, info: ShardInfo, source: str, allow_unsafe_types: bool = False) -> RecordLayout:
        """The layout a shard entry of index.json describes, checked for consistency.

        Raises:
            EncodingError: a column has an unknown encoding.
            IndexFormatError: ``column_sizes`` disagrees with the encodings.
            UnsafeTypeError: a column is ``pkl`` and ``allow_unsafe_types`` is False.
        """
        where = f"{source}: shard {info.index} ({info.raw_data.basename})"
        if len(set(info.column_names)) != len(info.column_names):
            raise IndexFormatError(f"{where}: column_names repeats a name: {list(info.column_names)}")
        encodings = []
        for j, (name, spec) in enumerate(zip(info.column_names, info.column_encodings, strict=True)):
            try:
                enc = get_encoding(spec)
            except EncodingError as exc:
                raise EncodingError(f"{where}, column {name!r}: {exc}") from None
            if enc.size != info.column_sizes[j]:
                raise IndexFormatError(
                    f"{where}: column_sizes[{j}] is {info.column_sizes[j]!r} but encoding {spec!r} of "
                    f"column {name!r} has size {enc.size!r}; the index is corrupt"
                )
            if not enc.safe and not allow_unsafe_types:
                raise UnsafeTypeError(
                    f"{where}: column {name!r} has encoding {spec!r}, which unpickles data and can run "
                    "arbitrary code; pass allow_unsafe_types=True only if you trust this dataset"
                )
            encodings.append(enc)
        return cls(info.column_names, info.column_encodings, tuple(encodings))

    def encode(self, sample: Mapping[str, Any], number: int) -> bytes:
        """Encode one sample; ``number`` (its index in the dataset) goes into errors.

        Raises:
            SampleError: a column is missing or extra, or a value does not fit its encoding.
        """
        # The writer's hot loop: one pass, no per-column helper calls. A bytes value is
        # stored verbatim whatever the encoding (the MDS rule for ready-made payloads).
        if type(sample) is not dict and not isinstance(sample, Mapping):
            raise SampleError(f"sample {number}: a sample must be a dict of column -> value, got {type(sample).__name__}")
        if len(sample) != len(self.names):
            raise self._columns_error(sample, number)
        head: list[int] = []
        body: list[bytes] = []
        for name, encode, size in self._encoders:
            try:
                value = sample[name]
            except KeyError:
                raise self._columns_error(sample, number) from None
            if type(value) is bytes:
                data = value
            else:
                try:
                    data = encode(value)
                except SampleError as exc:
                    raise SampleError(f"sample {number}, column {name!r}: {exc}") from None
            if size < 0:
                head.append(len(data))
            elif len(data) != size:
                raise SampleError(
                    f"sample {number}, column {name!r}: encoding {self.specs[self.names.index(name)]!r} needs "
                    f"exactly {size} bytes, the value gives {len(data)} (bytes values are stored as they are)"
                )
            body.append(data)
        if head:
            body.insert(0, self._head.pack(*head))
        return b"".join(body)

    def _columns_error(self, sample: Mapping[str, Any], number: int) -> SampleError:
        missing = [n for n in self.names if n not in sample]
        extra = [k for k in sample if k not in self.names]
        return SampleError(
            f"sample {number}: missing columns {missing}, unexpected columns {extra}; "
            f"the writer's columns are {list(self.names)}"
        )

    def split(self, buf: Buffer, begin: int) -> list[tuple[int, int]]:
        """(start, end) of every column of the record starting at ``begin``."""
        spans = []
        if self.num_var:
            head = self._head.unpack_from(buf, begin)
            pos = begin + 4 * self.num_var
        else:
            head, pos = (), begin
        for _name, _dec, size, var in self._plan:
            n = size if var < 0 else head[var]
            spans.append((pos, pos + n))
            pos += n
        return spans

    def decode(self, view: memoryview, begin: int) -> dict[str, Any]:
        """Decode the record at ``begin`` of ``view`` (its length was validated at open).

        Raises:
            Exception: whatever a decoder raises; the shard reader adds the context.
        """
        sample: dict[str, Any] = {}
        if self.num_var:
            head = self._head.unpack_from(view, begin)
            pos = begin + 4 * self.num_var
        else:
            head, pos = (), begin
        for name, dec, size, var in self._plan:
            n = size if var < 0 else head[var]
            sample[name] = dec(view[pos : pos + n])
            pos += n
        return sample

    def failing_column(self, view: memoryview, begin: int) -> tuple[str, Exception] | None:
        """The first column of the record at ``begin`` that does not decode, and why."""
        for name, enc, (start, end) in zip(self.names, self.encodings, self.split(view, begin), strict=True):
            try:
                enc.decode_unchecked(view[start:end])
            except AstreamError:
                raise
            except Exception as exc:
                return name, exc
        return None

    def same_columns(self, other: object) -> bool:
        """True if ``other`` stores the same columns with the same encodings."""
        return isinstance(other, RecordLayout) and (self.names, self.specs) == (other.names, other.specs)

