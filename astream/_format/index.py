"""``index.json`` (version 2) as typed, validated objects.

The index lists every shard with the writer's config repeated per shard and the
raw/compressed file info. Anything malformed raises :class:`IndexFormatError`
naming the file and the field (``shards[3].raw_data.bytes``), so a bad dataset is
rejected before any sample is read.
"""

from __future__ import annotations

import json
import os
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from astream._format.names import unsafe_name
from astream.errors import IndexFormatError, IndexJSONError

__all__ = ["INDEX_NAME", "MAX_INDEX_BYTES", "FileInfo", "Index", "ShardInfo", "SourceRanges"]

INDEX_NAME = "index.json"
# The largest index file read: a million MDS shards (~450 bytes each) with room to spare.
# Parsed, an index takes ~10x its size in memory, so this bounds what a hostile file costs.
MAX_INDEX_BYTES = 1 << 30
# Counts and sizes are int64 in the sample arithmetic (NumPy): a larger one would wrap.
MAX_INT = 2**63 - 1
_FORMATS = ("mds", "json", "csv", "tsv", "xsv", "parquet", "webdataset")
# Formats whose shards are read in place from a source file (byte ranges of it), not
# written by a writer: their index is built by astream from the files themselves.
_SOURCED = ("parquet",)
# Formats whose shard is one file (the text formats add a .meta file).
_ONE_FILE = ("mds", "webdataset", *_SOURCED)
# Keys of a shard entry that describe files or counts; every other key is writer config.
_FILE_KEYS = ("raw_data", "zip_data", "raw_meta", "zip_meta")


class _Fields:
    """Typed access to one JSON object, with errors that say where the bad field is."""

    def __init__(self, obj: Any, where: str, source: str) -> None:
        if not isinstance(obj, dict):
            raise IndexFormatError(f"{source}: {where} must be a JSON object, got {type(obj).__name__}")
        self.obj: dict[str, Any] = obj
        self.where = where
        self.source = source

    def fail(self, key: str, what: str) -> IndexFormatError:
        return IndexFormatError(
            f"{source_label(self.source)}: {self.where}.{key} {what}; "
            "the dataset's index is corrupt or was not written by an MDS writer"
        )

    def get(self, key: str, required: bool = True) -> Any:
        if key not in self.obj:
            if required:
                raise self.fail(key, "is missing")
            return None
        return self.obj[key]

    def int_(self, key: str, nullable: bool = False, required: bool = True) -> int | None:
        value = self.get(key, required=required and not nullable)
        if value is None and (nullable or not required):
            return None
        if isinstance(value, bool) or not isinstance(value, int) or not 0 <= value <= MAX_INT:
            raise self.fail(key, f"must be a non-negative integer below 2**63, got {value!r}")
        return value

    def str_(self, key: str, nullable: bool = False) -> str | None:
        value = self.get(key, required=not nullable)
        if value is None and nullable:
            return None
        if not isinstance(value, str):
            raise self.fail(key, f"must be a string, got {value!r}")
        return value

    def str_list(self, key: str) -> tuple[str, ...]:
        value = self.get(key)
        if not isinstance(value, list) or not all(isinstance(v, str) for v in value):
            raise self.fail(key, f"must be a list of strings, got {value!r}")
        return tuple(value)


def source_label(source: str) -> str:
    return source


def too_large(source: str, size: int | None = None) -> IndexFormatError:
    """The error for an index file over :data:`MAX_INDEX_BYTES` (``size`` if known)."""
    what = f"{size} bytes" if size is not None else "larger"
    return IndexFormatError(f"{source}: {what}, over the {MAX_INDEX_BYTES >> 20} MiB astream reads of an index "
                            "file; is it one? (a million shards take ~450 MB)")


def _check_basename(basename: str, fields: _Fields, key: str) -> str:
    # Base names may hold one relative directory (merge_index output: "3/shard.00000.mds"),
    # but never an absolute path, "." or "..", or a NUL: a dataset must not write outside its root.
    why = unsafe_name(basename, max_parts=2)
    if why is not None:
        raise fields.fail(key, f"is not a safe relative file name: {basename!r} {why}")
    return basename


@dataclass(frozen=True)
class FileInfo:
    """One file of a shard: its name relative to the dataset root, size, and digests."""

    basename: str
    bytes: int
    hashes: Mapping[str, str] = field(default_factory=dict)

    @classmethod
    def from_json(cls, obj: Any, where: str, source: str) -> FileInfo:
        f = _Fields(obj, where, source)
        basename = _check_basename(f.str_("basename") or "", f, "basename")
        size = f.int_("bytes")
        hashes = f.get("hashes", required=False) or {}
        if not isinstance(hashes, dict) or not all(
            isinstance(k, str) and isinstance(v, str) for k, v in hashes.items()
        ):
            raise f.fail("hashes", f"must map algorithm names to hex digests, got {hashes!r}")
        assert size is not None
        return cls(basename, size, dict(hashes))

    def to_json(self) -> dict[str, Any]:
        return {"basename": self.basename, "bytes": self.bytes, "hashes": dict(self.hashes)}


@dataclass(frozen=True)
class SourceRanges:
    """Where a shard's file comes from when it is not a file of its own (a Parquet row group).

    The shard's data file is the concatenation of ``ranges`` (``[start, end)`` byte ranges,
    in order) of the source file ``file`` (relative to the dataset root). ``file_bytes`` and
    ``etag`` are the source file's size and version when the index was built, and
    ``last_xxh64`` the xxh64 digest of the last range (the file's footer), so a changed
    file is noticed when the shard is fetched.
    """

    file: str
    file_bytes: int
    etag: str | None
    ranges: tuple[tuple[int, int], ...]
    last_xxh64: str

    @classmethod
    def from_json(cls, obj: Any, where: str, source: str) -> SourceRanges:
        f = _Fields(obj, where, source)
        file = _check_basename(f.str_("file") or "", f, "file")
        size = f.int_("file_bytes")
        etag = f.str_("etag", nullable=True)
        raw = f.get("ranges")
        if not isinstance(raw, list) or not raw or not all(
            isinstance(r, list) and len(r) == 2 and all(isinstance(x, int) and not isinstance(x, bool) for x in r)
            and 0 <= r[0] <= r[1] <= (size or 0) for r in raw
        ):
            raise f.fail("ranges", f"must list [start, end] byte ranges inside the file's {size} bytes, got {raw!r}")
        digest = f.str_("last_xxh64") or ""
        assert size is not None
        return cls(file, size, etag, tuple((int(a), int(b)) for a, b in raw), digest)

    def to_json(self) -> dict[str, Any]:
        return {"etag": self.etag, "file": self.file, "file_bytes": self.file_bytes,
                "last_xxh64": self.last_xxh64, "ranges": [list(r) for r in self.ranges]}

    @property
    def nbytes(self) -> int:
        """Bytes of the shard's file (the ranges together)."""
        return sum(b - a for a, b in self.ranges)


@dataclass(frozen=True)
class ShardInfo:
    """One shard entry of index.json.

    ``config`` holds the writer configuration keys exactly as stored (for MDS:
    column_encodings, column_names, column_sizes, compression, format, hashes,
    size_limit, version); the typed attributes are views of it.
    """

    index: int
    format: str
    samples: int
    raw_data: FileInfo
    zip_data: FileInfo | None
    compression: str | None
    hashes: tuple[str, ...]
    column_names: tuple[str, ...]
    column_encodings: tuple[str, ...]
    column_sizes: tuple[int | None, ...]
    size_limit: int | None
    config: Mapping[str, Any]
    raw_meta: FileInfo | None = None
    zip_meta: FileInfo | None = None
    source: SourceRanges | None = None

    @property
    def stored(self) -> FileInfo:
        """The data file as it lies on the remote: compressed if there is compression."""
        return self.zip_data if self.zip_data is not None else self.raw_data

    @property
    def stored_meta(self) -> FileInfo | None:
        """The meta file (split formats only) as it lies on the remote."""
        return self.zip_meta if self.zip_meta is not None else self.raw_meta

    @classmethod
    def from_json(cls, obj: Any, position: int, source: str) -> ShardInfo:
        where = f"shards[{position}]"
        f = _Fields(obj, where, source)
        version = f.get("version")
        if version != 2:
            raise f.fail("version", f"must be 2, got {version!r}")
        fmt = f.str_("format") or ""
        if fmt not in _FORMATS:
            raise f.fail("format", f"must be one of {', '.join(_FORMATS)}, got {fmt!r}")
        samples = f.int_("samples")
        assert samples is not None
        compression = f.str_("compression", nullable=True)
        hashes = f.str_list("hashes") if f.get("hashes", required=False) is not None else ()
        raw_data = FileInfo.from_json(f.get("raw_data"), f"{where}.raw_data", source)
        zip_obj = f.get("zip_data", required=False)
        zip_data = None if zip_obj is None else FileInfo.from_json(zip_obj, f"{where}.zip_data", source)
        if compression is not None and zip_data is None:
            raise f.fail("zip_data", f"is null although compression is {compression!r}")
        if compression is None and zip_data is not None:
            raise f.fail("zip_data", "describes a compressed file although compression is null")
        raw_meta = zip_meta = None
        if fmt not in _ONE_FILE:
            raw_meta = FileInfo.from_json(f.get("raw_meta"), f"{where}.raw_meta", source)
            zm = f.get("zip_meta", required=False)
            zip_meta = None if zm is None else FileInfo.from_json(zm, f"{where}.zip_meta", source)
        names: tuple[str, ...] = ()
        encodings: tuple[str, ...] = ()
        sizes: tuple[int | None, ...] = ()
        if fmt == "json":
            columns = f.get("columns")
            if not isinstance(columns, dict) or not all(
                isinstance(k, str) and isinstance(v, str) for k, v in columns.items()
            ):
                raise f.fail("columns", f"must map column names to encodings, got {columns!r}")
            names = tuple(sorted(columns))
            encodings = tuple(columns[n] for n in names)
            sizes = (None,) * len(names)
        else:
            names = f.str_list("column_names")
            encodings = f.str_list("column_encodings")
            if len(names) != len(encodings):
                raise f.fail("column_encodings", f"has {len(encodings)} entries for {len(names)} columns")
            if fmt == "mds":
                raw_sizes = f.get("column_sizes")
                if not isinstance(raw_sizes, list) or len(raw_sizes) != len(names) or not all(
                    s is None or (isinstance(s, int) and not isinstance(s, bool) and 0 <= s <= MAX_INT) for s in raw_sizes
                ):
                    raise f.fail("column_sizes", f"must list a size or null per column, got {raw_sizes!r}")
                sizes = tuple(raw_sizes)
            else:
                sizes = (None,) * len(names)
        size_limit = f.int_("size_limit", nullable=True, required=False)
        source_ranges = None
        if fmt in _SOURCED:
            source_ranges = SourceRanges.from_json(f.get("source"), f"{where}.source", source)
            if source_ranges.nbytes != raw_data.bytes or compression is not None:
                raise f.fail("source", f"ranges hold {source_ranges.nbytes} bytes, raw_data {raw_data.bytes} "
                                       f"(and compression must be null)")
        config = {k: v for k, v in f.obj.items() if k not in (*_FILE_KEYS, "samples", "source")}
        return cls(
            index=position, format=fmt, samples=samples, raw_data=raw_data, zip_data=zip_data,
            compression=compression, hashes=hashes, column_names=names, column_encodings=encodings,
            column_sizes=sizes, size_limit=size_limit, config=config, raw_meta=raw_meta, zip_meta=zip_meta,
            source=source_ranges,
        )

    def to_json(self) -> dict[str, Any]:
        """The shard entry as index.json stores it."""
        obj: dict[str, Any] = dict(self.config)
        obj["samples"] = self.samples
        obj["raw_data"] = self.raw_data.to_json()
        obj["zip_data"] = None if self.zip_data is None else self.zip_data.to_json()
        if self.source is not None:
            obj["source"] = self.source.to_json()
        elif self.format not in _ONE_FILE:
            obj["raw_meta"] = None if self.raw_meta is None else self.raw_meta.to_json()
            obj["zip_meta"] = None if self.zip_meta is None else self.zip_meta.to_json()
        return dict(sorted(obj.items()))


@dataclass(frozen=True)
class Index:
    """A parsed index.json: the ordered shards of one dataset (or split).

    ``shards`` is a tuple, or a node's mapped binary index made into shards on demand
    (:class:`~astream._format.binindex.ShardTable`, whose ``samples`` column answers the
    sizes without making any).
    """

    shards: Sequence[ShardInfo]
    source: str = INDEX_NAME

    @property
    def num_samples(self) -> int:
        column = getattr(self.shards, "samples", None)
        if column is not None:
            return int(column.sum())
        return sum(s.samples for s in self.shards)

    @property
    def shard_sizes(self) -> list[int]:
        column = getattr(self.shards, "samples", None)
        if column is not None:
            return list(column.tolist())
        return [s.samples for s in self.shards]

    @classmethod
    def from_json(cls, obj: Any, source: str = INDEX_NAME) -> Index:
        """Validate a decoded index.json object.

        Raises:
            IndexFormatError: a field is missing or malformed.
        """
        f = _Fields(obj, "index", source)
        if f.get("version") != 2:
            raise f.fail("version", f"must be 2, got {f.get('version')!r}")
        shards = f.get("shards")
        if not isinstance(shards, list):
            raise f.fail("shards", f"must be a list, got {type(shards).__name__}")
        parsed = tuple(ShardInfo.from_json(s, i, source) for i, s in enumerate(shards))
        if sum(s.samples for s in parsed) > MAX_INT:
            raise f.fail("shards", "hold more than 2**63 - 1 samples in all")
        return cls(parsed, source)

    @classmethod
    def from_bytes(cls, data: bytes, source: str = INDEX_NAME) -> Index:
        """Parse the bytes of an index.json file.

        Raises:
            IndexFormatError: not UTF-8 JSON, or a malformed field.
        """
        if len(data) > MAX_INDEX_BYTES:
            raise too_large(source, len(data))
        try:
            obj = json.loads(data)
        except json.JSONDecodeError as exc:
            what = "empty" if not data.strip() else f"not valid JSON ({exc})"
            raise IndexJSONError(f"{source}: {what}; the file is corrupt or truncated", exc.pos, exc.lineno,
                                 exc.colno) from exc
        except (UnicodeDecodeError, ValueError) as exc:
            raise IndexJSONError(f"{source}: not valid JSON ({exc}); the file is corrupt or truncated") from exc
        except RecursionError as exc:  # arrays nested thousands deep: not an index
            raise IndexFormatError(f"{source}: JSON nested too deep to be an index.json") from exc
        return cls.from_json(obj, source)

    @classmethod
    def load(cls, path: str | os.PathLike[str]) -> Index:
        """Read and validate the index.json at ``path``.

        Raises:
            IndexFormatError: the file is missing, unreadable or malformed.
        """
        try:
            with open(path, "rb") as fh:
                size = os.fstat(fh.fileno()).st_size
                if size > MAX_INDEX_BYTES:
                    raise too_large(os.fspath(path), size)
                data = fh.read()
        except FileNotFoundError as exc:
            raise IndexFormatError(f"{os.fspath(path)}: no index.json here; is this an MDS dataset directory?") from exc
        except OSError as exc:
            raise IndexFormatError(f"{os.fspath(path)}: cannot read index.json: {exc}") from exc
        return cls.from_bytes(data, os.fspath(path))

    def to_json(self) -> dict[str, Any]:
        return {"shards": [s.to_json() for s in self.shards], "version": 2}

    def dumps(self) -> bytes:
        """index.json bytes as MosaicML's writer produces them (one line, sorted keys)."""
        return json.dumps(self.to_json(), sort_keys=True).encode("utf-8")
