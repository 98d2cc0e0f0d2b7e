"""``astream inspect``: what a dataset holds, from its index.json alone.

Columns and encodings, shards, samples, raw and stored sizes, compression and hashes,
for a local directory or a remote URL (only index.json is fetched).
"""

from __future__ import annotations

import argparse
import json
from collections import Counter
from typing import Any

from astream._format.index import Index, ShardInfo
from astream.cli._output import format_size, print_table
from astream.cli._source import dataset_root, read_index

__all__ = ["add_parser", "describe", "run"]

_SHOWN_SHARDS = 10


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    """Declare ``astream inspect``."""
    p = sub.add_parser("inspect", parents=[common], help="show a dataset's columns, shards, sizes and hashes",
                       description="Show what an MDS dataset holds (reads index.json only).")
    p.add_argument("location", metavar="PATH_OR_URL", help="dataset directory, file://, http(s):// or s3:// URL")
    p.add_argument("--split", help="sub-folder of the dataset holding the split's index.json")
    p.add_argument("--json", action="store_true", help="print the summary as JSON")
    p.add_argument("--all-shards", action="store_true", help=f"list every shard (default: the first {_SHOWN_SHARDS})")
    p.set_defaults(func=run)


def describe(index: Index, location: str) -> dict[str, Any]:
    """The summary ``inspect`` prints, as plain data."""
    shards = index.shards
    first = shards[0] if shards else None
    columns = [] if first is None else [
        {"name": n, "encoding": e, "size": s}
        for n, e, s in zip(first.column_names, first.column_encodings, first.column_sizes, strict=True)
    ]
    mismatched = [s.index for s in shards if first is not None and
                  (s.column_names, s.column_encodings) != (first.column_names, first.column_encodings)]
    return {
        "location": location,
        "formats": sorted({s.format for s in shards}),
        "samples": index.num_samples,
        "shards": len(shards),
        "raw_bytes": sum(s.raw_data.bytes for s in shards),
        "stored_bytes": sum(s.stored.bytes for s in shards),
        "compression": sorted({s.compression or "none" for s in shards}),
        "hashes": sorted({h for s in shards for h in s.hashes}),
        "size_limit": sorted({s.size_limit for s in shards if s.size_limit is not None}),
        "columns": columns,
        "shards_with_other_columns": mismatched,
        "shard_list": [_shard(s) for s in shards],
    }


def _shard(s: ShardInfo) -> dict[str, Any]:
    return {"basename": s.stored.basename, "samples": s.samples, "raw_bytes": s.raw_data.bytes,
            "stored_bytes": s.stored.bytes, "hashes": dict(s.stored.hashes)}


def run(args: argparse.Namespace) -> int:
    """Print the summary; exit code 0."""
    index = read_index(args.location, args.split)
    info = describe(index, dataset_root(args.location, args.split))
    if args.json:
        print(json.dumps(info, indent=2))
        return 0
    raw, stored = info["raw_bytes"], info["stored_bytes"]
    ratio = f" ({raw / stored:.2f}x)" if stored and stored != raw else ""
    print(f"dataset      {info['location']}")
    print(f"format       {', '.join(info['formats']) or '-'}")
    print(f"samples      {info['samples']:,}")
    print(f"shards       {info['shards']:,}")
    print(f"size         {format_size(raw)} raw, {format_size(stored)} stored{ratio}")
    print(f"compression  {', '.join(info['compression']) or '-'}")
    print(f"hashes       {', '.join(info['hashes']) or 'none'}")
    if info["size_limit"]:
        print(f"size limit   {', '.join(format_size(v) for v in info['size_limit'])}")
    print("\ncolumns")
    print_table(["name", "encoding", "bytes"],
                [[c["name"], c["encoding"], "variable" if c["size"] is None else c["size"]] for c in info["columns"]])
    if info["shards_with_other_columns"]:
        print(f"  warning: shards {info['shards_with_other_columns'][:10]} have other columns than shard 0")
    shown = info["shard_list"] if args.all_shards else info["shard_list"][:_SHOWN_SHARDS]
    algo = info["hashes"][0] if info["hashes"] else None
    print("\nshards")
    print_table(
        ["file", "samples", "raw", "stored", *([algo] if algo else [])],
        [[s["basename"], f"{s['samples']:,}", format_size(s["raw_bytes"]), format_size(s["stored_bytes"]),
          *([s["hashes"].get(algo, "-")] if algo else [])] for s in shown],
        right=(1, 2, 3),
    )
    if len(shown) < info["shards"]:
        print(f"  ... {info['shards'] - len(shown)} more (--all-shards lists them)")
    sizes = Counter(s["samples"] for s in info["shard_list"])
    if len(sizes) > 1:
        print(f"  samples per shard: {min(sizes)}..{max(sizes)}")
    return 0
