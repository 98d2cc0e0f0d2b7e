"""Writers of the peer's text formats: JSONL (``json``) and delimited text (``csv``, ``tsv``, ``xsv``).

Each shard is two files (see :mod:`astream._format.split`): the data file, one line per
sample (a delimited shard starts with a header line of the column names), and a
``.meta`` file with uint32 ``n``, ``n + 1`` uint32 offsets of the lines in the data file
and the writer's config as JSON. The bytes are MosaicML Streaming's: a JSONL line is
``json.dumps(values, sort_keys=True)`` and the newline; a delimited line is the values
(``str``, ``int`` rendered with ``str()``, ``float`` with ``str()``) joined by the
separator, in the sorted order of the column names. Only the records count toward
``size_limit`` (not the header nor the meta file), as in MosaicML.

Delimited text has no quoting: a value holding the separator or the newline cannot be
written and is refused (:class:`SampleError`), as MosaicML refuses it (by an assert).
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np

from astream._format.index import FileInfo, ShardInfo
from astream._format.shard_writer import ShardFile, ShardWriter, config_bytes
from astream.errors import ConfigError, EncodingError, SampleError

__all__ = ["CSVWriter", "JSONWriter", "TSVWriter", "XSVWriter"]

# The Python type a value of each encoding must have. bool is an int to Python but not
# to these formats: "True" in an int column of a CSV file does not read back as an int.
_TYPES: dict[str, type] = {"str": str, "int": int, "float": float}


def _check_newline(newline: object) -> str:
    if not isinstance(newline, str) or not newline:
        raise ConfigError(f"newline must be a non-empty string, got {newline!r}")
    return newline


def _check_encodings(columns: Mapping[str, str], fmt: str) -> None:
    for name, encoding in columns.items():
        if encoding not in _TYPES:
            raise EncodingError(
                f"column {name!r}: encoding {encoding!r} is not one of str, int, float (the encodings of "
                f"the {fmt!r} format); use MDSWriter for other types"
            )


def _check_value(value: Any, encoding: str, name: str, position: int, fmt: str) -> None:
    want = _TYPES[encoding]
    if not isinstance(value, want) or (want is int and isinstance(value, bool)):
        raise SampleError(
            f"sample {position}, column {name!r}: the {fmt!r} encoding {encoding!r} needs a Python "
            f"{want.__name__}, got {type(value).__name__} {value!r}; convert it first (e.g. {want.__name__}(value))"
        )


def _meta(records: list[bytes], first: int, config: bytes) -> list[bytes]:
    """A meta file: sample count, the offsets of every line (from ``first``), the config."""
    sizes = np.fromiter((len(r) for r in records), np.int64, len(records))
    offsets = np.concatenate(([0], np.cumsum(sizes))) + first
    return [np.uint32(len(records)).tobytes(), offsets.astype("<u4").tobytes(), config]


class _TextWriter(ShardWriter):
    """What the JSONL and the delimited writers share: the meta file and the index entry."""

    def __init__(
        self, out: str | os.PathLike[str], columns: Mapping[str, str], compression: str | None,
        hashes: Sequence[str] | None, size_limit: int | str | None, exist_ok: bool, newline: str,
    ) -> None:
        super().__init__(out, columns, compression, hashes, size_limit, exist_ok)
        self.newline = _check_newline(newline)
        _check_encodings(columns, self.format)
        self.columns = dict(columns)
        self.column_names = tuple(sorted(columns))
        self.column_encodings = tuple(columns[n] for n in self.column_names)
        self._config: dict[str, Any] = {}
        self._config_bytes = b""

    def _set_config(self, config: dict[str, Any]) -> None:
        self._config = config
        self._config_bytes = config_bytes(config)
        self._start()

    def _values(self, sample: Mapping[str, Any], position: int) -> list[Any]:
        """The sample's values in column-name order, each checked against its encoding."""
        if not isinstance(sample, Mapping):
            raise SampleError(f"sample {position}: must be a dict of column -> value, got {type(sample).__name__}")
        if len(sample) != len(self.column_names) or any(n not in sample for n in self.column_names):
            # As MDSWriter: a key that is not a column would be dropped silently (MosaicML does).
            missing = [n for n in self.column_names if n not in sample]
            extra = [k for k in sample if k not in self.columns]
            raise SampleError(
                f"sample {position}: missing columns {missing}, unexpected columns {extra}; "
                f"the writer's columns are {list(self.column_names)}"
            )
        values = []
        for name, encoding in zip(self.column_names, self.column_encodings, strict=True):
            value = sample[name]
            _check_value(value, encoding, name, position, self.format)
            values.append(value)
        return values

    def _shard_entry(self, position: int, samples: int, files: list[tuple[FileInfo, FileInfo | None]]) -> ShardInfo:
        (raw_data, zip_data), (raw_meta, zip_meta) = files
        return ShardInfo(
            index=position, format=self.format, samples=samples, raw_data=raw_data, zip_data=zip_data,
            compression=self.compression, hashes=tuple(self.hashes), column_names=self.column_names,
            column_encodings=self.column_encodings, column_sizes=(None,) * len(self.column_names),
            size_limit=self.size_limit, config=dict(self._config), raw_meta=raw_meta, zip_meta=zip_meta,
        )


class JSONWriter(_TextWriter):
    r"""Write a MosaicML-Streaming-compatible JSONL dataset (format ``json``) into a local directory.

    Args:
        out: the output directory (created if needed).
        columns: column name -> ``"str"``, ``"int"`` or ``"float"``.
        compression, hashes, size_limit, exist_ok: as for :class:`MDSWriter`.
        newline: written after every sample's JSON object (default ``"\n"``).

    Raises:
        ConfigError: a bad parameter (named), or ``out`` is not empty.
        EncodingError: a column's encoding is not str, int or float.
    """

    format = "json"

    def __init__(
        self, out: str | os.PathLike[str], columns: Mapping[str, str], compression: str | None = None,
        hashes: Sequence[str] | None = None, size_limit: int | str | None = 1 << 26, exist_ok: bool = False,
        *, newline: str = "\n",
    ) -> None:
        super().__init__(out, columns, compression, hashes, size_limit, exist_ok, newline)
        self._set_config({**self._base_config(), "columns": self.columns, "newline": self.newline})

    def _encode(self, sample: Mapping[str, Any], position: int) -> bytes:
        values = self._values(sample, position)
        try:
            # allow_nan (the default): MosaicML writes NaN/Infinity, and json.loads reads them back.
            text = json.dumps(dict(zip(self.column_names, values, strict=True)), sort_keys=True)
        except ValueError as exc:  # an int past Python's int-to-str digit limit
            raise SampleError(f"sample {position}: cannot be written as JSON: {exc}") from exc
        return (text + self.newline).encode("utf-8")

    def _shard_files(self, records: list[bytes]) -> list[ShardFile]:
        return [(None, list(records)), ("meta", _meta(records, 0, self._config_bytes))]



class XSVWriter(_TextWriter):
    r"""Write a MosaicML-Streaming-compatible delimited-text dataset (format ``xsv``).

    Columns are stored in sorted name order, after a header line of their names.

    Args:
        out: the output directory (created if needed).
        columns: column name -> ``"str"``, ``"int"`` or ``"float"``.
        compression, hashes, size_limit, exist_ok: as for :class:`MDSWriter`.
        separator: the string between two values (required; CSVWriter and TSVWriter fix it).
        newline: written after every line (default ``"\n"``).

    Raises:
        ConfigError: a bad parameter (named), a column name holding the separator or the
            newline, or ``out`` is not empty.
        EncodingError: a column's encoding is not str, int or float.
    """

    format = "xsv"

    def __init__(
        self, out: str | os.PathLike[str], columns: Mapping[str, str], compression: str | None = None,
        hashes: Sequence[str] | None = None, size_limit: int | str | None = 1 << 26, exist_ok: bool = False,
        *, separator: str, newline: str = "\n",
    ) -> None:
        super().__init__(out, columns, compression, hashes, size_limit, exist_ok, newline)
        if not isinstance(separator, str) or not separator:
            raise ConfigError(f"separator must be a non-empty string, got {separator!r}")
        if separator in self.newline or self.newline in separator:
            raise ConfigError(f"separator {separator!r} and newline {self.newline!r} must not contain one another")
        self.separator = separator
        for name in self.column_names:
            if separator in name or self.newline in name:
                raise ConfigError(
                    f"column name {name!r} holds the separator {separator!r} or the newline {self.newline!r}, "
                    f"which the {self.format!r} header cannot hold; rename the column"
                )
        self._header = (separator.join(self.column_names) + self.newline).encode("utf-8")
        self._set_config(self._xsv_config())

    def _xsv_config(self) -> dict[str, Any]:
        return {
            **self._base_config(), "column_encodings": list(self.column_encodings),
            "column_names": list(self.column_names), "newline": self.newline, "separator": self.separator,
        }

    def _encode(self, sample: Mapping[str, Any], position: int) -> bytes:
        texts = []
        for name, value in zip(self.column_names, self._values(sample, position), strict=True):
            try:
                text = value if isinstance(value, str) else str(value)
            except ValueError as exc:  # an int past Python's int-to-str digit limit
                raise SampleError(f"sample {position}, column {name!r}: cannot be written as text: {exc}") from exc
            for what, bad in (("separator", self.separator), ("newline", self.newline)):
                if bad in text:
                    raise SampleError(
                        f"sample {position}, column {name!r}: the value {text!r} holds the {what} {bad!r}, "
                        f"which the {self.format!r} format cannot quote; use JSONWriter or MDSWriter for such text"
                    )
            texts.append(text)
        return (self.separator.join(texts) + self.newline).encode("utf-8")

    def _shard_files(self, records: list[bytes]) -> list[ShardFile]:
        data = [self._header, *records]
        return [(None, data), ("meta", _meta(records, len(self._header), self._config_bytes))]



class _NamedXSVWriter(XSVWriter):
    """A delimited format whose name fixes the separator (``csv``, ``tsv``)."""

    _SEPARATOR = ""

    def __init__(
        self, out: str | os.PathLike[str], columns: Mapping[str, str], compression: str | None = None,
        hashes: Sequence[str] | None = None, size_limit: int | str | None = 1 << 26, exist_ok: bool = False,
        *, newline: str = "\n",
    ) -> None:
        super().__init__(out, columns, compression, hashes, size_limit, exist_ok, separator=self._SEPARATOR,
                         newline=newline)

    def _xsv_config(self) -> dict[str, Any]:
        # The format name implies the separator, so MosaicML leaves it out of the config.
        config = super()._xsv_config()
        del config["separator"]
        return config


class CSVWriter(_NamedXSVWriter):
    r"""Write a MosaicML-Streaming-compatible CSV dataset (format ``csv``, separator ``","``).

    Args:
        out, columns, compression, hashes, size_limit, exist_ok, newline: as for :class:`XSVWriter`.
    """

    format = "csv"
    _SEPARATOR = ","



class TSVWriter(_NamedXSVWriter):
    r"""Write a MosaicML-Streaming-compatible TSV dataset (format ``tsv``, separator ``"\t"``).

    Args:
        out, columns, compression, hashes, size_limit, exist_ok, newline: as for :class:`XSVWriter`.
    """

    format = "tsv"
    _SEPARATOR = "\t"

