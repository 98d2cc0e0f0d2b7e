"""``astream verify``: check every shard file against the sizes and hashes in index.json.

Each stored file (the compressed one when there is compression) is streamed through
the storage backend of its URL and hashed as it arrives, never held whole in memory
and never written to disk; several files are checked at once. Every bad file is
reported, and the exit code is 1 if there is one. ``--report`` reads every sample
instead (:mod:`astream.cli._verify_report`).
"""

from __future__ import annotations

import argparse
import asyncio
from dataclasses import dataclass
from typing import Any

from astream._format.hashing import Hasher, check_algorithm, new_hasher
from astream._format.index import FileInfo, Index
from astream._storage.loop import run as run_loop
from astream._storage.registry import StoragePool, join_url
from astream._storage.sink import BufferedSink
from astream.cli._output import CommandError, format_size, progress
from astream.cli._source import dataset_root, read_index
from astream.cli._verify_report import report
from astream.errors import DownloadError, RemoteNotFoundError

__all__ = ["Problem", "add_parser", "run", "verify_index"]


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    """Declare ``astream verify``."""
    p = sub.add_parser("verify", parents=[common], help="check every shard's size and hash against index.json",
                       description="Check every shard file's size and hashes against index.json; "
                                   "exit code 1 if any is missing or differs.")
    p.add_argument("location", metavar="PATH_OR_URL", help="dataset directory, file://, http(s):// or s3:// URL")
    p.add_argument("--split", help="sub-folder of the dataset holding the split's index.json")
    p.add_argument("--hash", dest="algos", action="append", metavar="ALGO",
                   help="check only this algorithm (repeatable; default: every one index.json records)")
    p.add_argument("--jobs", type=int, default=None, help="files checked at once (default: 8; not with --report)")
    p.add_argument("--report", action="store_true",
                   help="read and decode every sample as a Loader with on_bad_sample='skip' would, and list every "
                        "bad sample and shard (docs/guide/bad-samples.md)")
    p.add_argument("--quarantine", metavar="FILE",
                   help="with --report: write the bad samples to FILE, for StreamingDataset(quarantine=FILE)")
    p.add_argument("--format", choices=("mds", "parquet", "webdataset"), default=None,
                   help="with --report: the dataset's format (default mds)")
    p.add_argument("--local", metavar="DIR", help="with --report: the cache folder to read through "
                                                  "(default: a temporary one, removed after)")
    p.add_argument("--batch-size", type=int, default=256, help="with --report: samples read at once (default 256)")
    p.set_defaults(func=run)


@dataclass(frozen=True)
class Problem:
    """One bad file: its name and what is wrong with it."""

    basename: str
    what: str


class _HashSink(BufferedSink):
    """Hashes a body as it arrives (in a worker thread), keeping nothing."""

    def __init__(self, algos: list[str], bar: Any) -> None:
        super().__init__()
        self.algos = algos
        self.bar = bar
        self.hashers: dict[str, Hasher] = {}
        self._reset()

    async def write(self, data: bytes) -> None:
        await super().write(data)
        self.bar.update(len(data))

    def _consume(self, chunks: list[bytes]) -> None:
        for chunk in chunks:
            for hasher in self.hashers.values():
                hasher.update(chunk)

    def _reset(self) -> None:
        self.hashers = {a: new_hasher(a) for a in self.algos}

    def _close_files(self) -> None:
        pass

    def _remove_files(self) -> None:
        pass


async def _check(pool: StoragePool, root: str, info: FileInfo, algos: list[str] | None, bar: Any) -> Problem | None:
    url = join_url(root, info.basename)
    wanted = [a for a in info.hashes if algos is None or a in algos]
    sink = _HashSink(wanted, bar)
    try:
        # No size given: a file of the wrong size is reported below, not raised.
        await pool.get(url).fetch_into(url, sink)
        await sink.drain()
    except RemoteNotFoundError:
        return Problem(info.basename, "missing")
    except DownloadError as exc:
        return Problem(info.basename, f"unreadable: {exc}")
    finally:
        sink.abort()
    if sink.received != info.bytes:
        return Problem(info.basename, f"is {sink.received} bytes, index.json says {info.bytes}")
    for algo, hasher in sink.hashers.items():
        digest = hasher.hexdigest()
        if digest != info.hashes[algo]:
            return Problem(info.basename, f"{algo} is {digest}, index.json says {info.hashes[algo]}")
    return None


async def verify_index(index: Index, root: str, algos: list[str] | None, jobs: int, bar: Any) -> list[Problem]:
    """Check every stored shard file of ``index`` under ``root``; returns the bad ones, in shard order."""
    gate = asyncio.Semaphore(jobs)
    async with StoragePool() as pool:

        async def one(info: FileInfo) -> Problem | None:
            async with gate:
                return await _check(pool, root, info, algos, bar)

        files = [f for s in index.shards for f in (s.stored, s.stored_meta) if f is not None]
        results = await asyncio.gather(*(one(f) for f in files))
    return [p for p in results if p is not None]


def run(args: argparse.Namespace) -> int:
    """Verify; exit code 0 if every file is good, 1 otherwise."""
    if args.report:
        if args.jobs is not None:
            raise CommandError("--jobs does not apply to --report (it reads shards as a Loader does)", 2)
        if args.algos is not None:
            args.algos = [check_algorithm(a, "--hash") for a in args.algos]
        return report(args)
    given = [f"--{name}" for name in ("quarantine", "format", "local") if getattr(args, name) is not None]
    if given:
        raise CommandError(f"{', '.join(given)} apply only with --report", 2)
    args.jobs = 8 if args.jobs is None else args.jobs
    if args.jobs < 1:
        raise CommandError(f"--jobs must be at least 1, got {args.jobs}", 2)
    algos = None if args.algos is None else [check_algorithm(a, "--hash") for a in args.algos]
    index = read_index(args.location, args.split)
    root = dataset_root(args.location, args.split)
    recorded = {h for s in index.shards for h in s.stored.hashes}
    if algos is not None and not set(algos) & recorded:
        raise CommandError(f"index.json records no {', '.join(algos)} digests (it has: "
                           f"{', '.join(sorted(recorded)) or 'none'})", 2)
    total = sum(s.stored.bytes + (s.stored_meta.bytes if s.stored_meta else 0) for s in index.shards)
    quiet = bool(getattr(args, "quiet", False))
    with progress(quiet, total=total, unit="B", unit_scale=True, unit_divisor=1024, desc="verify") as bar:
        problems = run_loop(verify_index(index, root, algos, args.jobs, bar))
    for p in problems:
        print(f"BAD  {p.basename}: {p.what}")
    checked = ", ".join(sorted(recorded if algos is None else recorded & set(algos))) or "sizes only, no hashes recorded"
    n = len(index.shards)
    if problems:
        print(f"{len(problems)} of {n} shards are bad ({checked}) in {root}")
        return 1
    if not quiet:
        print(f"all {n} shards good ({format_size(total)}; {checked})")
    return 0
