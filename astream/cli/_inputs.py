"""The inputs ``astream convert`` reads, cut into parts that worker processes convert.

A :class:`Part` is a picklable description of a contiguous run of rows: a byte range
of a JSONL file (lines belong to the part their first byte falls in), a whole CSV
file, row groups of a Parquet file, or a row range of NumPy arrays. Parts in order
give the rows in input order. :func:`read_part` yields a part's rows as dicts and
reports progress in the part's own unit (bytes for text, rows otherwise).

NumPy input is a folder of either ``.npz`` archives (each holds named arrays of
equal length: the columns; the archives' rows follow each other in name order) or
``.npy`` files (each one column, named after the file, all of equal length).
"""

from __future__ import annotations

import csv
import itertools
import json
import os
import zipfile
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from astream.cli._output import CommandError
from astream.errors import MissingExtraError

__all__ = ["FORMATS", "Part", "detect_format", "plan_parts", "read_part", "typed_columns"]

FORMATS = ("jsonl", "csv", "parquet", "numpy")
_EXTENSIONS = {
    ".jsonl": "jsonl", ".ndjson": "jsonl", ".json": "jsonl", ".csv": "csv", ".tsv": "csv",
    ".parquet": "parquet", ".pq": "parquet", ".npy": "numpy", ".npz": "numpy",
}
Progress = Callable[[int], None]


@dataclass(frozen=True)
class Part:
    """A contiguous run of input rows.

    Attributes:
        kind: ``jsonl``, ``csv``, ``parquet``, ``npz`` or ``npy``.
        paths: the file (or for ``npy``, the column files).
        start, stop: bytes (jsonl), row groups (parquet) or rows (numpy); unused for csv.
        work: the progress units the part amounts to.
        unit: what the units are (``"B"`` or ``"rows"``).
    """

    kind: str
    paths: tuple[str, ...]
    start: int = 0
    stop: int = 0
    work: int = 0
    unit: str = "rows"
    names: tuple[str, ...] = field(default=())


def pyarrow_parquet() -> Any:
    """``pyarrow.parquet``, or MissingExtraError naming the extra to install."""
    try:
        import pyarrow.parquet as pq
    except ImportError as exc:
        raise MissingExtraError("converting Parquet", "convert", "pyarrow") from exc
    return pq


def detect_format(paths: list[str]) -> str:
    """The input format from the file extensions (a folder: the files in it).

    Raises:
        CommandError: (code 2) no files, or extensions of several formats or none known.
    """
    found = {_EXTENSIONS.get(os.path.splitext(p)[1].lower()) for p in _files(paths)}
    if None in found or len(found) != 1:
        raise CommandError(f"cannot tell the input format of {', '.join(paths)} from the file names; "
                           f"give --format ({', '.join(FORMATS)})", 2)
    return str(found.pop())


def _files(paths: list[str]) -> list[str]:
    out: list[str] = []
    for path in paths:
        if os.path.isdir(path):
            out.extend(sorted(os.path.join(path, f) for f in os.listdir(path)
                              if not f.startswith(".") and os.path.isfile(os.path.join(path, f))))
        elif os.path.isfile(path):
            out.append(path)
        else:
            raise CommandError(f"{path}: no such file or directory")
    if not out:
        raise CommandError(f"no input files in {', '.join(paths)}")
    return out


def _of_format(paths: list[str], fmt: str) -> list[str]:
    # Files named on the command line are taken whatever their extension (`--format jsonl
    # data.txt`); a folder contributes the files of the format only.
    files = [f for p in paths for f in _files([p])
             if not os.path.isdir(p) or _EXTENSIONS.get(os.path.splitext(f)[1].lower()) == fmt]
    if not files:
        raise CommandError(f"no {fmt} files in {', '.join(paths)}")
    return files


def plan_parts(paths: list[str], fmt: str, parts: int) -> list[Part]:
    """Cut the input into about ``parts`` parts (at least one per file), in row order.

    Raises:
        CommandError: missing files, or NumPy arrays of unequal lengths.
        MissingExtraError: Parquet input without pyarrow.
    """
    files = _of_format(paths, fmt)
    # A file larger than an even share is split; several small files stay whole.
    if fmt == "jsonl":
        total = sum(os.path.getsize(f) for f in files)
        share = max(1, -(-total // parts))
        out = []
        for f in files:
            size = os.path.getsize(f)
            cuts = [*range(0, size, share), size]
            out += [Part("jsonl", (f,), a, b, b - a, "B") for a, b in itertools.pairwise(cuts)]
        return out or [Part("jsonl", (files[0],), 0, 0, 0, "B")]
    if fmt == "csv":
        return [Part("csv", (f,), work=os.path.getsize(f), unit="B") for f in files]
    if fmt == "parquet":
        pq = pyarrow_parquet()
        out = []
        for f in files:
            meta = pq.ParquetFile(f).metadata
            groups = meta.num_row_groups
            rows = [meta.row_group(g).num_rows for g in range(groups)]
            step = max(1, -(-groups // max(1, parts // len(files))))
            out += [Part("parquet", (f,), g, min(g + step, groups), sum(rows[g : g + step]))
                    for g in range(0, groups, step)]
        return out
    return _numpy_parts(files, parts)


def typed_columns(part: Part) -> dict[str, str]:
    """Encodings that the input's own types fix (Parquet's schema); other inputs: none.

    The mapping is :func:`astream.convert.arrow_columns`'s (``int64`` -> ``int``, nested
    lists of numbers -> ``ndarray:DTYPE``, with the shape when the list types fix it, dates
    and timestamps -> ``int64``...); columns without an encoding there are left to inference
    from the values.
    """
    if part.kind != "parquet":
        return {}
    return _schema_columns(pyarrow_parquet().read_schema(part.paths[0]))


def _schema_columns(schema: Any) -> dict[str, str]:
    # The same Arrow -> MDS mapping as the distributed converters (astream.convert).
    import pyarrow as pa

    from astream.convert._types import infer_encoding

    out: dict[str, str] = {}
    for column in schema:
        encoding = infer_encoding(pa, column.type)
        if encoding is not None:
            out[column.name] = encoding
    return out


def _numpy_parts(files: list[str], parts: int) -> list[Part]:
    npz = [f for f in files if f.endswith(".npz")]
    npy = [f for f in files if f.endswith(".npy")]
    if npz and npy:
        raise CommandError("a NumPy input folder holds .npz archives or .npy columns, not both", 2)
    if npz:
        out = []
        for f in npz:
            lengths = _npz_lengths(f)
            rows = _equal_length(lengths, f)
            out += _row_ranges("npz", (f,), rows, max(1, parts // len(npz)), tuple(lengths))
        return out
    shapes = {os.path.splitext(os.path.basename(f))[0]: np.load(f, mmap_mode="r").shape for f in npy}
    lengths = {k: s[0] if s else -1 for k, s in shapes.items()}
    rows = _equal_length(lengths, os.path.dirname(npy[0]) or ".")
    return _row_ranges("npy", tuple(npy), rows, parts, tuple(lengths))


def _npz_lengths(path: str) -> dict[str, int]:
    """The first dimension of each array in an .npz archive (-1 for 0-d), from the headers only."""
    readers = {(1, 0): np.lib.format.read_array_header_1_0, (2, 0): np.lib.format.read_array_header_2_0}
    lengths: dict[str, int] = {}
    try:
        with zipfile.ZipFile(path) as archive:
            for member in archive.namelist():
                if not member.endswith(".npy"):
                    continue
                with archive.open(member) as fh:
                    read_header = readers.get(np.lib.format.read_magic(fh))
                    if read_header is None:  # a newer header version: read the array itself
                        with np.load(path, allow_pickle=False) as z:
                            shape = z[member[:-4]].shape
                    else:
                        shape = read_header(fh)[0]
                lengths[member[:-4]] = shape[0] if shape else -1
    except (OSError, ValueError, zipfile.BadZipFile) as exc:
        raise CommandError(f"{path}: not a readable .npz archive ({exc})") from exc
    return lengths


def _equal_length(lengths: dict[str, int], where: str) -> int:
    if not lengths or -1 in lengths.values():
        raise CommandError(f"{where}: every array needs a first axis of rows (found {lengths or 'no arrays'})")
    if len(set(lengths.values())) != 1:
        raise CommandError(f"{where}: the arrays have different lengths ({lengths}); each row is one sample, "
                           "so every column needs the same number of rows")
    return next(iter(lengths.values()))


def _row_ranges(kind: str, paths: tuple[str, ...], rows: int, parts: int, names: tuple[str, ...]) -> list[Part]:
    step = max(1, -(-rows // parts))
    return [Part(kind, paths, a, min(a + step, rows), min(a + step, rows) - a, names=names)
            for a in range(0, rows, step)]


def read_part(part: Part, progress: Progress) -> Generator[tuple[str, dict[str, Any]], None, None]:
    """The rows of ``part`` as ``(where, row)``; ``where`` names the row in error messages."""
    if part.kind == "jsonl":
        yield from _jsonl(part, progress)
    elif part.kind == "csv":
        yield from _csv(part, progress)
    elif part.kind == "parquet":
        yield from _parquet(part, progress)
    else:
        yield from _numpy(part, progress)


def _jsonl(part: Part, progress: Progress) -> Iterator[tuple[str, dict[str, Any]]]:
    path = part.paths[0]
    with open(path, "rb") as fh:
        if part.start:
            # Skip the line that began before this part (the previous part reads it).
            fh.seek(part.start - 1)
            fh.readline()
        pos = fh.tell()
        while pos < part.stop:
            line = fh.readline()
            if not line:
                break
            where = f"{path} at byte {pos}"
            pos += len(line)
            progress(len(line))
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except ValueError as exc:
                raise CommandError(f"{where}: not a JSON line ({exc})") from exc
            if not isinstance(row, dict):
                raise CommandError(f"{where}: each line must be a JSON object, got {type(row).__name__}")
            yield where, row


def _csv(part: Part, progress: Progress) -> Iterator[tuple[str, dict[str, Any]]]:
    path = part.paths[0]
    delimiter = "\t" if path.lower().endswith(".tsv") else ","
    with open(path, newline="", encoding="utf-8") as fh:
        reader = csv.DictReader(fh, delimiter=delimiter)
        if not reader.fieldnames:
            raise CommandError(f"{path}: no header line (the first line must name the columns)")
        done = 0
        for row in reader:
            where = f"{path} line {reader.line_num}"
            if None in row:
                raise CommandError(f"{where}: more cells than the header has columns")
            yield where, dict(row)
            # Progress by an estimate of bytes (text mode has no cheap tell()).
            step = sum(len(v) + 1 for v in row.values() if v is not None)
            done += step
            progress(step)
        progress(max(0, part.work - done))


def _parquet(part: Part, progress: Progress) -> Iterator[tuple[str, dict[str, Any]]]:
    from astream.convert._types import batch_samples
    from astream.errors import SampleError

    pq = pyarrow_parquet()
    path = part.paths[0]
    parquet = pq.ParquetFile(path)
    # Only the columns whose Python values (to_pylist) are not what their encoding takes are
    # converted here: lists (one reshape per batch), dates, timestamps, dictionaries.
    typed = {name: encoding for name, encoding in _schema_columns(parquet.schema_arrow).items()
             if _needs_conversion(parquet.schema_arrow.field(name).type)}
    n = 0
    for batch in parquet.iter_batches(batch_size=1024, row_groups=list(range(part.start, part.stop))):
        def where(i: int, base: int = n) -> str:
            return f"{path} row {base + i} of row groups {part.start}..{part.stop - 1}"

        if not typed:
            for i, row in enumerate(batch.to_pylist()):
                yield where(i), row
        else:
            try:
                converted = list(batch_samples(batch, typed, where))
            except SampleError as exc:
                raise CommandError(str(exc)) from exc
            others = [c for c in batch.schema.names if c not in typed]
            rest = batch.select(others).to_pylist() if others else [{}] * batch.num_rows
            for i in range(batch.num_rows):
                values = {**converted[i], **rest[i]}
                yield where(i), {name: values[name] for name in batch.schema.names}
        n += batch.num_rows
        progress(batch.num_rows)


def _needs_conversion(kind: Any) -> bool:
    import pyarrow as pa

    types = pa.types
    return bool(types.is_list(kind) or types.is_large_list(kind) or types.is_fixed_size_list(kind)
                or types.is_date(kind) or types.is_timestamp(kind) or types.is_dictionary(kind))


def _numpy(part: Part, progress: Progress) -> Iterator[tuple[str, dict[str, Any]]]:
    if part.kind == "npz":
        with np.load(part.paths[0], allow_pickle=False) as z:
            # One read per array: indexing an NpzFile reads and decompresses the whole array.
            arrays = {k: z[k] for k in z.files}
    else:
        arrays = {name: np.load(p, mmap_mode="r", allow_pickle=False)
                  for name, p in zip(part.names, part.paths, strict=True)}
    where = part.paths[0] if part.kind == "npz" else os.path.dirname(part.paths[0]) or "."
    for i in range(part.start, part.stop):
        yield f"{where} row {i}", {k: np.asarray(a[i]) for k, a in arrays.items()}
        progress(1)
