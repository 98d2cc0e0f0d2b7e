"""An index's per-shard facts as columns, whichever way the index was read.

The dataset's start-up loops over every shard (the state's fingerprint, the mixture's stream
keys, the node agent's address, the layouts, the byte sizes, the hash check) read these
instead of one :class:`~astream._format.index.ShardInfo` per shard. An index backed by the
node's binary index (:class:`~astream._format.binindex.ShardTable`) answers each from its
mapped columns and from what its builder worked out once (:func:`columns_of`); any other
index (Parquet and WebDataset listings, a tuple of shards) is walked here, the same answer.
Each function is one definition for both: the builder calls the per-shard ones.
"""

from __future__ import annotations

import json
import weakref
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import xxhash
from numpy.typing import NDArray

from astream._format.index import Index, ShardInfo

__all__ = ["IndexColumns", "columns_of", "identity_text", "shard_identity", "shard_view", "stored_algos"]


def shard_identity(sh: ShardInfo) -> tuple[Any, ...]:
    """What a state's fingerprint holds of a shard: name, samples, bytes, and for files read
    in place (Parquet, WebDataset) their size and version (etag), so a changed file is noticed."""
    if sh.source is not None:
        return sh.raw_data.basename, sh.samples, sh.raw_data.bytes, sh.source.file_bytes, sh.source.etag
    if sh.format == "webdataset":
        extra = sh.config.get("webdataset")
        return sh.raw_data.basename, sh.samples, sh.raw_data.bytes, extra.get("etag") if isinstance(extra, dict) else None
    return sh.raw_data.basename, sh.samples, sh.raw_data.bytes


def identity_text(identities: Iterable[Sequence[Any]]) -> str:
    """The JSON text of a stream's shard identities, as the fingerprint and the stream key
    have always hashed it (``json.dumps`` of a list of lists, its default separators)."""
    return json.dumps([list(s) for s in identities])


def shard_view(sh: ShardInfo) -> bytes:
    """What the node agent's address holds of a shard (files, digests, samples, columns)."""
    zip_data = sh.zip_data
    return repr((sh.raw_data.basename, sh.raw_data.bytes, sorted(sh.raw_data.hashes.items()),
                 None if zip_data is None else (zip_data.basename, zip_data.bytes, sorted(zip_data.hashes.items())),
                 sh.samples, sh.column_names, sh.column_encodings, sh.format)).encode()


def stored_algos(sh: ShardInfo) -> set[str]:
    """The digests the index gives for the shard's data file as stored remotely (what
    ``validate_hash`` needs of every shard)."""
    return set(sh.stored.hashes)


@dataclass(frozen=True)
class IndexColumns:
    """One index's per-shard facts.

    Attributes:
        samples: samples per shard (int64).
        sizes: per shard, its files' bytes (int64, shape ``(4, shards)``: raw data, zip data,
            raw meta, zip meta; -1 where it has none).
        groups: per shard, which of ``representatives`` shares its writer config (int64):
            shards of one group have one layout.
        representatives: the first shard of each group (made on demand).
        identity: the UTF-8 :func:`identity_text` of the shards, in chunks (read once, to hash).
        identity_xxh64: its xxh64 (hex): the stream's key in a mixture.
        view_digest: the xxh3-128 of the shards' :func:`shard_view` bytes, in order.
        algos: the digests every shard's stored files carry (:func:`stored_algos`).
    """

    samples: NDArray[np.int64]
    sizes: NDArray[np.int64]
    groups: NDArray[np.int64]
    representatives: tuple[ShardInfo, ...]
    identity: Callable[[], Iterator[bytes]]
    identity_xxh64: str
    view_digest: str
    algos: frozenset[str]

    @property
    def raw_bytes(self) -> NDArray[np.int64]:
        """Each shard's uncompressed data file, in bytes."""
        row: NDArray[np.int64] = self.sizes[0]
        return row

    def footprints(self, keep_zip: bool) -> NDArray[np.int64]:
        """Bytes each shard takes in a cache once installed (its raw files, and with
        ``keep_zip`` its compressed ones too)."""
        have = self.sizes >= 0
        raw, zipped = np.where(have[0::2], self.sizes[0::2], 0), np.where(have[1::2], self.sizes[1::2], 0)
        total = raw.sum(axis=0)
        if keep_zip:
            total = total + (zipped * have[0::2]).sum(axis=0)
        return total  # type: ignore[no-any-return]


def walk_columns(shards: Iterable[ShardInfo], count: int) -> IndexColumns:
    """:class:`IndexColumns` by one pass over ``shards`` (what the binary index's builder
    records, and the answer for an index that has no binary form)."""
    samples = np.empty(count, np.int64)
    sizes = np.full((4, count), -1, np.int64)
    groups = np.empty(count, np.int64)
    reps: dict[str, int] = {}
    firsts: list[ShardInfo] = []
    identities: list[tuple[Any, ...]] = []
    view = xxhash.xxh3_128()
    algos: set[str] | None = None
    for i, sh in enumerate(shards):
        samples[i] = sh.samples
        for k, f in enumerate((sh.raw_data, sh.zip_data, sh.raw_meta, sh.zip_meta)):
            if f is not None:
                sizes[k, i] = f.bytes
        key = json.dumps(sh.config, sort_keys=True)
        group = reps.get(key)
        if group is None:
            group = reps[key] = len(firsts)
            firsts.append(sh)
        groups[i] = group
        identities.append(shard_identity(sh))
        view.update(shard_view(sh))
        have = stored_algos(sh)
        algos = have if algos is None else algos & have
    text = identity_text(identities).encode()
    return IndexColumns(samples, sizes, groups, tuple(firsts), lambda: iter((text,)), xxhash.xxh64_hexdigest(text),
                        view.hexdigest(), frozenset(algos or ()))


def columns_of(index: Index) -> IndexColumns:
    """The columns of ``index``: its binary form's (no shard made but the representatives),
    or worked out by one walk over its shards, kept while the index lives (the dataset
    asks for them several times as it starts)."""
    table = index.shards
    made = getattr(table, "columns", None)
    if made is not None:
        got = made()
        assert isinstance(got, IndexColumns)
        return got
    kept = _WALKED.get(id(index))
    if kept is not None and kept[0]() is index:
        return kept[1]
    cols = walk_columns(table, len(table))
    key = id(index)
    _WALKED[key] = (weakref.ref(index, lambda _: _WALKED.pop(key, None)), cols)
    return cols


# (by id: an Index holds dicts, so it is not hashable; its weak reference clears the entry)
_WALKED: dict[int, tuple[weakref.ref[Index], IndexColumns]] = {}
