"""Inputs as files read inside the tasks through astream's storage layer.

For a store an engine cannot read by itself (Spark has no ``s3a://`` or ``gs://`` without
the hadoop-aws or GCS connector jars, which come from Maven), the driver lists the inputs
with astream's storage (local folders, ``s3://``, ``gs://``, ``azure://``, ...), cuts the
sorted file list into groups of about ``target_bytes``, and each task downloads its files
one at a time through the same layer and reads them with pyarrow:

* ``parquet``: ``ParquetFile.iter_batches``, cast to the first file's schema;
* ``jsonl``: ``pyarrow.json.read_json`` with the schema read from the first file;
* ``image``: two columns, ``path`` (the URL) and ``image`` (the file's bytes).

The schema, and so the columns, is decided on the driver before any task runs: a Parquet
file's footer (one ranged read), the first MiB of a JSONL file. A later file that does
not fit it (a column missing, a type that does not cast) fails its task with
:class:`SampleError` naming the file; a Parquet column the first file lacks is not read.
A task's disk holds one input file at a time (remote inputs only; local files are read
in place).
"""

from __future__ import annotations

import io
import os
import tempfile
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import Any

from astream._storage.local import local_path_of
from astream._storage.loop import run as run_loop
from astream._storage.registry import StoragePool, join_url, scheme_of
from astream.convert._types import pyarrow
from astream.convert.sources import ENGINE_FORMATS, IMAGE_EXTENSIONS
from astream.errors import ConfigError, RangeNotSupportedError, RemoteNotFoundError, SampleError

__all__ = ["FileInputs", "list_inputs"]

EXTENSIONS = {"parquet": (".parquet", ".pq"), "jsonl": (".jsonl", ".ndjson", ".json"), "image": IMAGE_EXTENSIONS}
_SCHEMA_PROBE = 1 << 20  # bytes of a JSONL file read for its schema
_FOOTER_PROBE = 1 << 16  # bytes of a Parquet file's tail read first (the footer is usually smaller)
_BATCH_ROWS = 4096
_BATCH_BYTES = 16 << 20  # of uncompressed values per batch, whatever the rows' size


def _is_local(url: str) -> bool:
    return scheme_of(url) in ("", "file")


def _of_format(name: str, fmt: str) -> bool:
    base = name.rsplit("/", 1)[-1]
    return not base.startswith((".", "_")) and os.path.splitext(base)[1].lower() in EXTENSIONS[fmt]


async def _alist(paths: Sequence[tuple[str, bool]], fmt: str) -> list[tuple[str, int]]:
    found: list[tuple[str, int]] = []
    async with StoragePool() as pool:
        for path, maybe_file in paths:
            store = pool.get(path)
            if maybe_file:
                try:
                    found.append((path, (await store.stat(path)).size))  # a file named
                    continue
                except RemoteNotFoundError:
                    pass  # a prefix named like a file (Spark writes folders called x.parquet)
            listed = await store.list_objects(path)
            found += [(join_url(path, name), info.size) for name, info in listed if _of_format(name, fmt)]
    return found


def list_inputs(paths: Sequence[str], fmt: str) -> list[tuple[str, int]]:
    """The ``fmt`` files at ``paths`` (files, folders or prefixes), with their sizes, in name order.

    Raises:
        ConfigError: an unknown format, or no such file under any of the paths.
        RemoteNotFoundError: a folder or file that does not exist.
    """
    if fmt not in ENGINE_FORMATS:
        raise ConfigError(f"format {fmt!r}: the file inputs are {', '.join(ENGINE_FORMATS)}")
    named = [os.fspath(p) for p in paths]
    # A path named like a file is one, unless it is a local folder (Spark writes x.parquet/ folders).
    maybe_files = [(p, _of_format(p, fmt) and not (_is_local(p) and os.path.isdir(local_path_of(p)))) for p in named]
    files = sorted(set(run_loop(_alist(maybe_files, fmt))))
    if not files:
        raise ConfigError(f"no {fmt} files ({', '.join(EXTENSIONS[fmt])}) under {', '.join(map(str, paths))}")
    return files


def _groups(files: list[tuple[str, int]], target_bytes: int, min_groups: int) -> tuple[tuple[str, ...], ...]:
    """Consecutive runs of files of about ``target_bytes`` each, and at least ``min_groups`` if there are files enough.

    A file goes to the group its middle byte falls in, the input cut into equal byte ranges.
    """
    total = sum(size for _, size in files)
    count = min(len(files), max(min_groups, -(-total // max(1, target_bytes)), 1))
    groups: list[list[str]] = [[] for _ in range(count)]
    done = 0
    for k, (url, size) in enumerate(files):
        slot = int((done + size / 2) * count // total) if total else k * count // len(files)
        groups[min(count - 1, slot)].append(url)
        done += size
    return tuple(tuple(g) for g in groups if g)


async def _read_range(url: str, start: int, end: int) -> bytes:
    async with StoragePool() as pool:
        store = pool.get(url)
        try:
            return await store.read_range(url, start, end)
        except RangeNotSupportedError:
            return (await store.read_bytes(url))[start:end]


def _schema(url: str, size: int, fmt: str) -> Any:
    pa = pyarrow()
    if fmt == "image":
        return pa.schema([("path", pa.string()), ("image", pa.binary())])
    try:
        if fmt == "parquet":
            import pyarrow.parquet as pq

            if _is_local(url):
                return pq.read_schema(local_path_of(url))
            tail = run_loop(_read_range(url, max(0, size - _FOOTER_PROBE), size))
            footer = int.from_bytes(tail[-8:-4], "little") + 8
            if footer > len(tail):
                tail = run_loop(_read_range(url, max(0, size - footer), size))
            # The footer alone is a readable Parquet "file" as far as the schema goes.
            return pq.read_schema(pa.BufferReader(tail))
        import pyarrow.json as pj

        head = run_loop(_read_range(url, 0, min(size, _SCHEMA_PROBE)))
        if size > len(head):
            head = head[: head.rfind(b"\n") + 1]
        return pj.read_json(io.BytesIO(head)).schema
    except (pa.ArrowException, ValueError, OSError) as exc:
        raise ConfigError(f"{url}: cannot read its {fmt} schema: {exc}") from exc


@dataclass(frozen=True)
class FileInputs:
    """Listed input files cut into groups, a task each, and the schema every file must fit.

    Picklable: the engine ships it to its tasks, which call :meth:`batches`.

    Attributes:
        fmt: ``parquet``, ``jsonl`` or ``image``.
        groups: the files of each task, in name order.
        schema: the ``pyarrow.Schema`` read on the driver from the first file.
    """

    fmt: str
    groups: tuple[tuple[str, ...], ...]
    schema: Any

    @classmethod
    def plan(cls, paths: Sequence[str], fmt: str, *, target_bytes: int = 256 << 20, min_groups: int = 1) -> FileInputs:
        """List ``paths`` and cut the files into groups of about ``target_bytes`` (at least ``min_groups``).

        Raises:
            ConfigError: a bad format, no input files, or an unreadable schema.
        """
        files = list_inputs(paths, fmt)
        return cls(fmt, _groups(files, target_bytes, min_groups), _schema(files[0][0], files[0][1], fmt))

    def batches(self, group: int) -> Iterator[Any]:
        """The record batches of group ``group``'s files, one file downloaded at a time.

        Raises:
            SampleError: a file does not fit the schema or is not of the format.
            DownloadError: a file could not be downloaded.
        """
        with tempfile.TemporaryDirectory(prefix="astream-input-") as scratch:
            for url in self.groups[group]:
                path = local_path_of(url) if _is_local(url) else os.path.join(scratch, "input")
                if not _is_local(url):
                    run_loop(_fetch(url, path))
                try:
                    yield from self._read(path, url)
                finally:
                    if not _is_local(url):
                        os.unlink(path)

    def _read(self, path: str, url: str) -> Iterator[Any]:
        pa = pyarrow()
        try:
            if self.fmt == "image":
                with open(path, "rb") as fh:
                    yield pa.RecordBatch.from_pydict({"path": [url], "image": [fh.read()]}, schema=self.schema)
                return
            if self.fmt == "jsonl":
                import pyarrow.json as pj

                options = pj.ParseOptions(explicit_schema=self.schema, unexpected_field_behavior="error")
                yield from pj.read_json(path, parse_options=options).to_batches(_BATCH_ROWS)
                return
            import pyarrow.parquet as pq

            source = pq.ParquetFile(path)
            for batch in source.iter_batches(_batch_rows(source.metadata), columns=self.schema.names):
                yield batch if batch.schema.equals(self.schema) else batch.cast(self.schema)
        except (pa.ArrowException, ValueError, KeyError) as exc:
            raise SampleError(f"{url}: does not fit the schema read from the first {self.fmt} file "
                              f"({', '.join(f'{f.name}: {f.type}' for f in self.schema)}): {exc}") from exc


def _batch_rows(metadata: Any) -> int:
    """Rows per batch so that one batch holds about ``_BATCH_BYTES`` (100 KB rows: 160 a batch)."""
    raw = sum(metadata.row_group(k).total_byte_size for k in range(metadata.num_row_groups))
    per_row = raw / max(1, metadata.num_rows)
    return max(1, min(_BATCH_ROWS, int(_BATCH_BYTES // max(1.0, per_row))))


async def _fetch(url: str, path: str) -> None:
    async with StoragePool() as pool:
        await pool.get(url).fetch(url, path)
