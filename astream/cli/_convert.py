"""``astream convert``: JSONL, CSV, Parquet or NumPy files into an MDS dataset.

The input is cut into parts (:mod:`astream.cli._inputs`); column encodings are inferred
from the first rows (:mod:`astream.cli._infer`) unless ``--columns`` gives them. One
worker converts in this process with a single writer. Several workers are processes
started with forkserver (spawn where there is none; never fork, as this process may
hold threads): each writes its parts as small datasets, which are then merged into one
flat dataset (:mod:`astream.cli._merge`). Workers report progress through a queue.
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import queue
import shutil
import tempfile
import time
from collections.abc import Callable, Mapping
from concurrent.futures import FIRST_EXCEPTION, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass
from itertools import islice
from typing import Any

from astream._format.writer import MDSWriter
from astream._storage.local import local_path_of
from astream._storage.loop import run as run_loop
from astream.cli._convert_engine import ENGINES, run_engine
from astream.cli._infer import coerce, infer_columns, parse_column_overrides
from astream.cli._inputs import FORMATS, Part, detect_format, plan_parts, read_part, typed_columns
from astream.cli._merge import PARTS_DIR, merge_parts
from astream.cli._out import prepare_out
from astream.cli._output import CommandError, format_size, progress
from astream.cli._source import is_local
from astream.cli._upload import remote_has_index, upload_dataset
from astream.errors import AstreamError, CompressionError, ConfigError, EncodingError, SampleError

__all__ = ["Settings", "add_parser", "run"]

_INFER_ROWS = 200
# Inputs smaller than this convert in-process unless --workers says otherwise: starting
# worker interpreters costs more than it saves.
_SMALL_INPUT = 16 << 20


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    """Declare ``astream convert``."""
    p = sub.add_parser(
        "convert", parents=[common], help="convert JSONL, CSV, Parquet or NumPy files to MDS",
        description="Convert JSONL, CSV/TSV, Parquet or a folder of NumPy files (.npy columns or .npz "
                    "archives) into an MDS dataset, in parallel processes.",
    )
    p.add_argument("inputs", nargs="+", metavar="INPUT", help="input files or folders (converted in order)")
    p.add_argument("-o", "--out", required=True,
                   help="the output directory, or a remote URL (s3://, or http:// accepting PUT) to upload to")
    p.add_argument("--format", choices=(*FORMATS, "image"),
                   help="the input format (default: from the file extensions); image needs --engine")
    p.add_argument("--columns", action="append", metavar="NAME:ENC,...",
                   help="encodings that override the inferred ones, e.g. 'label:int8,emb:ndarray:float32:4,8'")
    p.add_argument("--compression", help="e.g. zstd, zstd:7, gz, bz2, br, snappy (default: none)")
    p.add_argument("--hashes", help="comma-separated hash algorithms to record, e.g. sha1,xxh64")
    p.add_argument("--size-limit", default="64mb", help="shard size limit, e.g. 64mb (default: 64mb)")
    p.add_argument("--workers", type=int, help="worker processes (default: 1 for small inputs, else the CPUs, up to 8)")
    p.add_argument("--parts", type=int, help="cut the input into this many parts (default: one per worker)")
    p.add_argument("--overwrite", action="store_true", help="replace the contents of a non-empty output directory")
    p.add_argument("--engine", choices=ENGINES, default="local",
                   help="where to convert: local processes (default), or a dask, ray or spark engine (started "
                        "on 127.0.0.1, or the cluster of DASK_SCHEDULER_ADDRESS / RAY_ADDRESS / SPARK_MASTER)")
    p.set_defaults(func=run)


@dataclass(frozen=True)
class Settings:
    """What every part is written with (picklable: it goes to the workers)."""

    columns: Mapping[str, str]
    text: bool
    compression: str | None
    hashes: tuple[str, ...]
    size_limit: str

    def writer(self, out: str) -> MDSWriter:
        """A writer of these settings into the (emptied) folder ``out``."""
        return MDSWriter(out, dict(self.columns), compression=self.compression, hashes=list(self.hashes),
                         size_limit=self.size_limit, exist_ok=True)


def _write_rows(writer: MDSWriter, part: Part, settings: Settings, report: Callable[[int], None]) -> None:
    known = set(settings.columns)
    for where, row in read_part(part, report):
        extra = set(row) - known
        if extra:
            raise CommandError(f"{where}: column(s) {', '.join(sorted(extra))} not in the first rows' columns "
                               f"({', '.join(settings.columns)}); give all of them with --columns")
        sample = {}
        for name, encoding in settings.columns.items():
            try:
                sample[name] = coerce(encoding, row.get(name), settings.text)
            except (ValueError, TypeError, OverflowError) as exc:
                raise CommandError(f"{where}: column {name!r} ({encoding}): {exc}; "
                                   f"pick another encoding with --columns {name}:ENCODING") from exc
        try:
            writer.write(sample)
        except SampleError as exc:
            raise CommandError(f"{where}: {exc}") from exc


# -- worker processes ------------------------------------------------------------------------

_progress_queue: Any = None


def _init_worker(progress_queue: Any) -> None:
    global _progress_queue
    _progress_queue = progress_queue


def _convert_part(part: Part, out: str, settings: Settings) -> int:
    """Write one part into ``out`` (a worker process); returns its samples."""
    pending, last = 0, time.monotonic()

    def report(n: int) -> None:
        nonlocal pending, last
        pending += n
        # Batched: one queue message per ~0.1 s, not one per row.
        if time.monotonic() - last > 0.1:
            _progress_queue.put(pending)
            pending, last = 0, time.monotonic()

    try:
        with settings.writer(out) as writer:
            _write_rows(writer, part, settings, report)
    except AstreamError as exc:
        # Not every astream error pickles (MissingExtraError takes three arguments).
        raise CommandError(str(exc), 2 if isinstance(exc, ConfigError) else 1) from None
    _progress_queue.put(pending)
    return writer.num_samples


def _context() -> multiprocessing.context.BaseContext:
    methods = multiprocessing.get_all_start_methods()
    return multiprocessing.get_context("forkserver" if "forkserver" in methods else "spawn")


def _convert_parallel(parts: list[Part], out: str, settings: Settings, workers: int, bar: Any) -> int:
    ctx = _context()
    progress_queue = ctx.Queue()
    folders = [os.path.join(out, PARTS_DIR, str(k)) for k in range(len(parts))]
    pool = ProcessPoolExecutor(workers, mp_context=ctx, initializer=_init_worker, initargs=(progress_queue,))
    futures: list[Future[int]] = [pool.submit(_convert_part, p, f, settings)
                                  for p, f in zip(parts, folders, strict=True)]
    try:
        pending: set[Future[int]] = set(futures)
        while pending:
            _, pending = wait(pending, timeout=0.1, return_when=FIRST_EXCEPTION)
            _drain(progress_queue, bar)
            failed = next((f for f in futures if f.done() and f.exception() is not None), None)
            if failed is not None:
                raise failed.exception()  # type: ignore[misc]
    except BaseException:
        # One bad row dooms the output: stop the other workers now rather than letting
        # them finish parts nobody will use (shutdown alone would wait for them).
        processes = list(getattr(pool, "_processes", {}).values())
        pool.shutdown(wait=False, cancel_futures=True)
        for process in processes:
            process.terminate()
        raise
    pool.shutdown(wait=True)
    _drain(progress_queue, bar)
    merge_parts(out, folders)
    return sum(f.result() for f in futures)


def _drain(progress_queue: Any, bar: Any) -> None:
    while True:
        try:
            bar.update(progress_queue.get_nowait())
        except queue.Empty:
            return


# -- the command ------------------------------------------------------------------------------

def _check_settings(settings: Settings) -> None:
    """Build (and drop) a writer now, so a bad setting fails before any work, as exit code 2."""
    with tempfile.TemporaryDirectory(prefix="astream-convert-") as scratch:
        try:
            settings.writer(os.path.join(scratch, "ds")).abort()
        except (EncodingError, CompressionError) as exc:
            raise CommandError(str(exc), 2) from exc


def run(args: argparse.Namespace) -> int:
    """Convert; exit code 0 on success."""
    for name in ("workers", "parts"):
        value = getattr(args, name)
        if value is not None and value < 1:
            raise CommandError(f"--{name} must be at least 1, got {value}", 2)
    if getattr(args, "engine", "local") != "local":
        return run_engine(args)
    if args.format == "image":
        raise CommandError("--format image converts on an engine: add --engine dask, ray or spark", 2)
    overrides = parse_column_overrides(args.columns or [])
    fmt = args.format or detect_format(args.inputs)
    workers = args.workers or _default_workers(args.inputs)
    parts = plan_parts(args.inputs, fmt, args.parts or workers)
    first_rows = _first_rows(parts, _INFER_ROWS)
    settings = Settings(
        columns=infer_columns(first_rows, fmt == "csv", overrides, typed_columns(parts[0])), text=fmt == "csv",
        compression=args.compression or None,
        hashes=tuple(h.strip() for h in (args.hashes or "").split(",") if h.strip()),
        size_limit=args.size_limit,
    )
    _check_settings(settings)
    quiet = bool(getattr(args, "quiet", False))
    if is_local(args.out):
        prepare_out(local_path_of(args.out), args.overwrite, args.inputs)
        return _convert(parts, local_path_of(args.out), settings, workers, fmt, quiet)
    # A remote output: convert into a local staging folder, then upload it.
    if run_loop(remote_has_index(args.out)) and not args.overwrite:
        raise CommandError(f"--out {args.out}: already holds a dataset; pass --overwrite to replace it", 2)
    with tempfile.TemporaryDirectory(prefix="astream-convert-") as staging:
        _convert(parts, staging, settings, workers, fmt, quiet)
        files = len(os.listdir(staging))
        with progress(quiet, total=files, unit="files", desc="upload") as bar:
            run_loop(upload_dataset(staging, args.out, 8, bar))
    if not quiet:
        print(f"uploaded {files} files to {args.out}")
    return 0


def _convert(parts: list[Part], out: str, settings: Settings, workers: int, fmt: str, quiet: bool) -> int:
    """Convert ``parts`` into the empty local folder ``out``; exit code 0."""
    if not quiet:
        print(f"converting {len(parts)} part(s) of {fmt} with {min(workers, len(parts))} worker(s); columns: "
              + ", ".join(f"{n}:{e}" for n, e in settings.columns.items()), flush=True)
    unit = parts[0].unit
    start = time.perf_counter()
    try:
        with progress(quiet, total=sum(p.work for p in parts), unit=unit, unit_scale=True,
                      desc="convert", **({"unit_divisor": 1024} if unit == "B" else {})) as bar:
            if workers == 1 or len(parts) == 1:
                with settings.writer(out) as writer:
                    for part in parts:
                        _write_rows(writer, part, settings, bar.update)
                samples = writer.num_samples
            else:
                samples = _convert_parallel(parts, out, settings, min(workers, len(parts)), bar)
    except BaseException:
        shutil.rmtree(os.path.join(out, PARTS_DIR), ignore_errors=True)
        raise
    if not quiet:
        stored = sum(os.path.getsize(os.path.join(out, f)) for f in os.listdir(out))
        print(f"wrote {samples:,} samples to {out} ({format_size(stored)}) in "
              f"{time.perf_counter() - start:.1f} s")
    return 0


def _first_rows(parts: list[Part], count: int) -> list[dict[str, Any]]:
    """The first ``count`` rows of the input, to infer the encodings from."""
    rows: list[dict[str, Any]] = []
    for part in parts:
        reader = read_part(part, lambda n: None)
        try:
            rows.extend(row for _, row in islice(reader, count - len(rows)))
        finally:
            reader.close()  # closes the input file now, not whenever the generator is collected
        if len(rows) >= count:
            break
    return rows


def _default_workers(inputs: list[str]) -> int:
    size = 0
    for path in inputs:
        if os.path.isdir(path):
            size += sum(e.stat().st_size for e in os.scandir(path) if e.is_file())
        elif os.path.isfile(path):
            size += os.path.getsize(path)
    return 1 if size < _SMALL_INPUT else max(1, min(os.cpu_count() or 1, 8))
