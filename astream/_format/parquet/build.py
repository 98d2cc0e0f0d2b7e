"""The index of a Parquet dataset: its files' footers turned into row-group shards.

Files are taken in sorted name order, so every rank of every node builds the same index.
Each row group becomes one shard entry (format ``parquet``) whose file is the row group's
projected column chunks followed by the file's footer, fetched as byte ranges of the
Parquet file (``source``): nothing else of the file is read. The entry records the
file's size and etag, which the dataset's fingerprint includes, and the footer's digest,
checked when the row group is fetched.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence
from typing import Any

import xxhash

from astream._format.index import Index, ShardInfo
from astream._format.parquet.footer import FileFooter, RowGroupShape, parse_footer, pyarrow
from astream.errors import ConfigError, IndexFormatError, LayoutWarning

__all__ = ["BIG_ROW_GROUP", "SMALL_ROW_GROUP", "build_index", "column_kind"]

# Row groups above this many bytes (uncompressed) make a reader hold too much at once.
BIG_ROW_GROUP = 128 << 20
# Row groups below this many rows make every shard a request of its own.
SMALL_ROW_GROUP = 1000


def column_kind(pa_type: Any, has_nulls: bool) -> tuple[str, str]:
    """How a column of ``pa_type`` comes out, and the encoding name ``columns`` shows.

    Kinds: ``array`` (one NumPy array per batch, a NumPy scalar per sample), ``scalars``
    (numbers with nulls: a list of NumPy scalars or None), ``fixed`` (a fixed-size list of
    numbers: a 2-D array per batch), ``ndarray`` (a variable-length list of numbers: one
    array per sample), ``str``, ``bytes``, ``object`` (anything else, as Python values).
    """
    pa, _ = pyarrow()
    t = pa_type
    numeric = pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t)
    if numeric or pa.types.is_timestamp(t) or pa.types.is_date(t) or pa.types.is_duration(t):
        dtype = str(pa.array([], t).to_numpy(zero_copy_only=False).dtype)
        if numeric and has_nulls:
            return "scalars", f"nullable:{dtype}"
        if (numeric or getattr(t, "tz", None) is None) and not has_nulls:
            return "array", dtype
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return "str", "str"
    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t):
        return "bytes", "bytes"
    if pa.types.is_fixed_size_list(t) and _is_number(pa, t.value_type) and not has_nulls:
        inner = str(pa.array([], t.value_type).to_numpy().dtype)
        return "fixed", f"ndarray:{inner}:{t.list_size}"
    if (pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t)) and _is_number(
            pa, t.value_type):
        inner = str(pa.array([], t.value_type).to_numpy().dtype)
        return "ndarray", f"ndarray:{inner}"
    return "object", "json"


def _is_number(pa: Any, t: Any) -> bool:
    return bool(pa.types.is_integer(t) or pa.types.is_floating(t))


def _projection(schema: Any, columns: Sequence[str] | None, where: str) -> list[str]:
    names = list(schema.names)
    if columns is None:
        return names
    missing = [c for c in columns if c not in names]
    if missing:
        raise ConfigError(f"columns={list(columns)!r}: {where} has no column {missing[0]!r}; its columns are {names}")
    if len(set(columns)) != len(columns):
        raise ConfigError(f"columns={list(columns)!r} names a column twice")
    return list(columns)


def build_index(files: Sequence[FileFooter], columns: Sequence[str] | None, where: str) -> Index:
    """The index whose shards are the row groups of ``files`` (sorted by name here).

    Args:
        files: each file's name (relative to the dataset root), size, etag and footer.
        columns: the columns to read (None: all), top-level names.
        where: the dataset's location, for messages.

    Raises:
        ConfigError: a projected column does not exist.
        IndexFormatError: no files, or files whose schemas differ.
        ShardFormatError: a footer is corrupt or points outside its file.
    """
    files = sorted(files, key=lambda f: f.name)
    if not files:
        raise IndexFormatError(f"{where}: no Parquet files (*.parquet) found")
    parsed = [(f, *parse_footer(f, where)) for f in files]
    first_file, schema, _ = parsed[0]
    for f, other, _ in parsed[1:]:
        if not other.equals(schema, check_metadata=False):
            raise IndexFormatError(
                f"{where}: {f.name} has schema {_schema_text(other)} but {first_file.name} has "
                f"{_schema_text(schema)}; every file of a stream must have the same columns and types"
            )
    names = _projection(schema, columns, where)
    nulls = {n: any(g.null_counts.get(n) is None or (g.null_counts.get(n) or 0) > 0 for _, _, gs in parsed
                    for g in gs) and schema.field(n).nullable for n in names}
    kinds = [column_kind(schema.field(n).type, nulls[n]) for n in names]
    tag = xxhash.xxh64("\0".join(names).encode()).hexdigest()[:8]
    shards: list[dict[str, Any]] = []
    big: list[str] = []
    small: list[str] = []
    for f, _, groups in parsed:
        digest = xxhash.xxh64(f.footer).hexdigest()
        flat = f.name.replace("/", "__")
        for g, shape in enumerate(groups):
            ranges = [*_ranges(shape, names), (f.footer_offset, f.size)]
            nbytes = sum(b - a for a, b in ranges)
            label = f"{f.name} row group {g}"
            if shape.total_byte_size > BIG_ROW_GROUP:
                big.append(label)
            elif shape.num_rows < SMALL_ROW_GROUP and g < len(groups) - 1:
                small.append(label)  # (a file's last row group holds the remainder)
            shards.append({
                "version": 2, "format": "parquet", "samples": shape.num_rows, "compression": None, "hashes": [],
                "size_limit": None, "column_names": names, "column_encodings": [k[1] for k in kinds],
                "parquet": {"row_group": g, "kinds": [k[0] for k in kinds],
                            "columns": len(ranges) - 1},
                # The footer's digest in the name: a changed file never meets its old row groups.
                "raw_data": {"basename": f"parquet-{tag}/{flat}.{digest[:12]}.rg{g:05d}", "bytes": nbytes,
                             "hashes": {}},
                "zip_data": None,
                "source": {"file": f.name, "file_bytes": f.size, "etag": f.etag, "last_xxh64": digest,
                           "ranges": [list(r) for r in ranges]},
            })
    _warn_layout(where, big, small)
    index = Index(tuple(ShardInfo.from_json(obj, i, where) for i, obj in enumerate(shards)), where)
    return index


def _ranges(shape: RowGroupShape, names: Sequence[str]) -> list[tuple[int, int]]:
    """The projected column chunks of a row group, in file order, adjacent ones merged."""
    spans = sorted(r for n in names for r in shape.chunks.get(n, []))
    out: list[tuple[int, int]] = []
    for a, b in spans:
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def _schema_text(schema: Any) -> str:
    return "{" + ", ".join(f"{f.name}: {f.type}" for f in schema) + "}"


def _warn_layout(where: str, big: list[str], small: list[str]) -> None:
    if big:
        warnings.warn(
            f"{where}: {len(big)} row group(s) hold over {BIG_ROW_GROUP >> 20} MB uncompressed (first: {big[0]}); "
            "each is read and decoded whole, so readers hold that much at once. Rewrite the files with "
            "smaller row groups (pyarrow: write_table(..., row_group_size=N)) or convert them to MDS "
            "with `astream convert`", LayoutWarning, stacklevel=3)
    if small:
        warnings.warn(
            f"{where}: {len(small)} row group(s) hold under {SMALL_ROW_GROUP} rows (first: {small[0]}); "
            "each is fetched with requests of its own, so streaming is slow. Rewrite the files with "
            "larger row groups (pyarrow: write_table(..., row_group_size=N)) or convert them to MDS "
            "with `astream convert`", LayoutWarning, stacklevel=3)
