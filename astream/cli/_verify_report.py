"""``astream verify DATASET --report``: every bad sample and shard of a dataset, ahead of time.

One pass over every sample, as a training run's ``Loader`` reads them with
``on_bad_sample="skip"`` (the same download, hash check and decoding, so the report lists
exactly what a run would meet), on one rank, in index order. Each lost shard is one line,
each other bad sample one line; ``--quarantine FILE`` writes them for
``StreamingDataset(on_bad_sample="skip", quarantine=FILE)``, which then never reads them.
"""

from __future__ import annotations

import argparse
import logging
import os
import tempfile
from collections import defaultdict

from astream._coord.world import World
from astream._dataset.dataset import StreamingDataset
from astream._dataset.loader import Loader
from astream._dataset.quarantine import BadSample
from astream._dataset.quarantine_file import write_quarantine
from astream.cli._output import CommandError, progress
from astream.cli._source import read_index

__all__ = ["report"]

EVERYTHING = 2**62  # the budget of a report: it lists, it never stops


def report(args: argparse.Namespace) -> int:
    """Read every sample; print the bad ones (exit code 1 if any) and write the quarantine file."""
    if args.batch_size < 1:
        raise CommandError(f"--batch-size must be at least 1, got {args.batch_size}", 2)
    fmt = args.format or "mds"
    hashed = None
    if fmt == "mds":
        recorded = sorted({h for s in read_index(args.location, args.split).shards for h in s.stored.hashes})
        hashed = (args.algos or recorded or [None])[0]
    quiet = bool(getattr(args, "quiet", False))
    with tempfile.TemporaryDirectory(prefix="astream-verify-") as scratch:
        ds = StreamingDataset(remote=args.location, local=args.local or scratch, split=args.split,
                              format=None if fmt == "mds" else fmt, batch_size=args.batch_size, shuffle=False,
                              validate_hash=hashed, on_bad_sample="skip", max_bad_samples=EVERYTHING,
                              world=World(rank=0, world_size=1, local_rank=0, ranks_per_node=1),
                              run_id=f"verify-{os.getpid()}")
        quiet_log = logging.getLogger("astream.dataset")
        level = quiet_log.level
        quiet_log.setLevel(logging.ERROR)  # (each bad sample is a line of the report instead)
        try:
            loader = Loader(ds)
            with progress(quiet, total=len(loader), unit="batch", desc="read") as bar:
                for _ in loader:
                    bar.update(1)
            bad = [BadSample(*q) for q in loader.stats().quarantined]
            smap = ds.sample_map
            if args.quarantine:
                write_quarantine(args.quarantine, args.location, ds.indexes[0], smap, bad)
        finally:
            quiet_log.setLevel(level)
            ds.close()
    by_shard: dict[int, list[BadSample]] = defaultdict(list)
    for record in sorted(bad, key=lambda r: r.sample):
        by_shard[smap.locate_one(record.sample)[0]].append(record)
    for shard, records in sorted(by_shard.items()):
        size = int(smap.starts[shard + 1] - smap.starts[shard])
        name = records[0].shard
        if len(records) == size and len({r.cause for r in records}) == 1:
            print(f"BAD  shard {name}: all {size} samples ({records[0].reason}): {records[0].cause}")
            continue
        for r in records:
            print(f"BAD  sample {r.sample} (record {r.sample - int(smap.starts[shard])} of {name}, "
                  f"{r.reason}): {r.cause}")
    total = smap.num_samples
    where = f" (quarantine written to {args.quarantine})" if args.quarantine else ""
    if bad:
        print(f"{len(bad)} of {total} samples are bad, in {len(by_shard)} of {smap.num_shards} shards{where}")
        return 1
    if not quiet:
        print(f"all {total} samples good ({smap.num_shards} shards read{', ' + hashed + ' checked' if hashed else ''})"
              f"{where}")
    return 0
