"""Quarantine files: the bad samples ``astream verify --report`` found, for a dataset to skip.

``astream verify DATASET --report --quarantine FILE`` reads every sample of a dataset once,
as a Loader would (with ``on_bad_sample="skip"``), and writes what was bad as JSON::

    {"astream_quarantine": 1, "dataset": "s3://bucket/ds", "fingerprint": "9f0c...",
     "samples": 60000, "bad": [{"shard": "shard.00012.mds", "record": 5, "reason": "decode",
                                "cause": "EncodingError: ..."}, ...]}

``StreamingDataset(on_bad_sample="skip", quarantine=FILE)`` applies it to every stream
whose shards have that fingerprint (names, sample counts, sizes: where the data lives does
not matter, a copy in another bucket matches): those samples are substituted without ever
being read. Entries name a shard file and a record in it, not a global sample id, so the
file applies whatever the other streams of a dataset are.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from astream._dataset.layout import SampleMap
from astream._dataset.quarantine import BadSample, Quarantine
from astream._dataset.state import fingerprint_of
from astream._format.columns import columns_of
from astream._format.index import Index
from astream.errors import ConfigError

__all__ = ["VERSION", "read_quarantine", "stream_fingerprint", "write_quarantine"]

VERSION = 1


def stream_fingerprint(index: Index) -> str:
    """The digest a quarantine file is matched by: one stream's shards, weights left out."""
    return fingerprint_of([(columns_of(index), {})])


def write_quarantine(path: str | os.PathLike[str], location: str, index: Index, smap: SampleMap,
                     bad: Sequence[BadSample]) -> None:
    """Write the bad samples of the one-stream dataset ``index`` (at ``location``) to ``path``."""
    entries = []
    for record in sorted(bad, key=lambda r: r.sample):
        shard, offset = smap.locate_one(record.sample)
        entries.append({"shard": index.shards[smap.shard_local[shard]].raw_data.basename, "record": offset,
                        "reason": record.reason, "cause": record.cause})
    body = {"astream_quarantine": VERSION, "dataset": location, "fingerprint": stream_fingerprint(index),
            "samples": index.num_samples, "bad": entries}
    Path(path).write_text(json.dumps(body, indent=1) + "\n")


def read_quarantine(given: Quarantine, indexes: Sequence[Index], smap: SampleMap) -> frozenset[int]:
    """The global sample ids ``quarantine=`` names: a quarantine file, or ids.

    Raises:
        ConfigError: the file is missing, is not a quarantine file, names a shard or record
            its stream lacks, or fits none of the dataset's streams.
    """
    if given is None:
        return frozenset()
    if not isinstance(given, (str, os.PathLike)):
        ids = frozenset(int(i) for i in given)
        if ids and (min(ids) < 0 or max(ids) >= smap.num_samples):
            raise ConfigError(f"quarantine= lists sample ids outside 0..{smap.num_samples - 1}")
        return ids
    where = os.fspath(given)
    try:
        body: Any = json.loads(Path(where).read_text())
    except (OSError, ValueError) as exc:
        raise ConfigError(f"quarantine={where!r}: cannot read it as a quarantine file ({exc}); "
                          "write one with `astream verify DATASET --report --quarantine FILE`") from exc
    if not isinstance(body, dict) or body.get("astream_quarantine") != VERSION or not isinstance(body.get("bad"), list):
        raise ConfigError(f"quarantine={where!r} is not an astream quarantine file (version {VERSION}); "
                          "write one with `astream verify DATASET --report --quarantine FILE`")
    streams = [k for k, index in enumerate(indexes) if stream_fingerprint(index) == body.get("fingerprint")]
    if not streams:
        raise ConfigError(f"quarantine={where!r} was written for {body.get('dataset')!r}, whose shards no stream "
                          "of this dataset has (another version of the data?): run `astream verify --report` again")
    first_shard = [0]
    for index in indexes:
        first_shard.append(first_shard[-1] + len(index.shards))
    found: set[int] = set()
    for k in streams:
        by_name = {sh.raw_data.basename: n for n, sh in enumerate(indexes[k].shards)}
        for entry in body["bad"]:
            name, record = (entry.get("shard"), entry.get("record")) if isinstance(entry, dict) else (None, None)
            local = by_name.get(name) if isinstance(name, str) else None
            if local is None or not isinstance(record, int) or not 0 <= record < indexes[k].shards[local].samples:
                raise ConfigError(f"quarantine={where!r}: entry {entry!r} names no record of this dataset's shards")
            found.add(int(smap.starts[first_shard[k] + local]) + record)
    return frozenset(found)
