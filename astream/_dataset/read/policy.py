"""``SourcePolicy``: which early sources apply to which shard, decided in this module only.

A batch's records come from its shards' installed files, the main path that always works.
Where a lease is still pending, three early sources may serve them first (behind the seam
of :mod:`astream._dataset.read.sources`): the shard's arriving file, ranged reads of the
remote, and a decoding made before the install (a resume's first Parquet row groups). Which
of them may serve a shard is a stage chosen once, not a flag re-read per batch:

- per dataset (a :class:`SourcePolicy`, made once per :class:`~astream._dataset.session.NodeSession`)
  and per shard, from the shard's kind and the stream's settings (below);
- per reader (:meth:`SourcePolicy.turns`, an :class:`EarlyTurns`): none at all with a
  bounded cache (its pins cover one batch, and an early read passes leases still in
  flight) or under ``on_bad_sample="skip"`` (only installed shards are substituted);
- and each source turned off by the reader's :class:`EarlyTurns` as it stops paying:
  ranged reads once a batch comes from the cache (later they fetch bytes the download
  fetches anyway), decodings after the first batches, and any source for a shard it failed
  on (a server without ranges, a header that disagrees with index.json: the download's own
  checks then report what is wrong) or whose budget it spent.

Per shard (every source needs a remote, so that there is an install to check against):

- the arriving file: MDS shards (their records are located by the offset table) of
  streams without ``validate_hash`` (a sample must not be handed out before its file's
  digest is checked);
- ranged reads: the same, stored uncompressed (``zip_data``: no byte range to read), and
  for remotes other than a local directory only where the process may use the network
  (not in loader worker processes: importing the HTTP client there costs more than it saves);
- a decoding: Parquet row groups, within :mod:`~astream._dataset.start.preopen`'s budgets.

Each shard's cache path comes from the cache layer's rule
(:func:`~astream._cache.cache.cache_path`), and whether it is installed from the cache
layer's check (:func:`~astream._cache.cache.is_installed`).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from astream._cache.cache import cache_path, is_installed
from astream._dataset.layout import SampleMap
from astream._format.index import ShardInfo
from astream._format.parquet.reader import ParquetLayout
from astream._format.record import RecordLayout
from astream._storage.base import StorageOptions
from astream._storage.registry import join_url, scheme_of

__all__ = ["ARRIVING", "DECODED", "RANGED", "EarlyTurns", "SourcePolicy"]

# The early sources, by name.
ARRIVING, RANGED, DECODED = "arriving", "ranged", "decoded"


class SourcePolicy:
    """Per shard of one dataset, where it lives in the cache and which early sources apply.

    Args:
        smap: the dataset's shards and how they decode.
        streams: its resolved streams (``remote``, ``split``, ``validate_hash``, ``local_dir``).
        transfers: per stream, the engine's transfer settings of its remote (the ranged reader's).
        network: whether ranged reads may go to remotes other than a local directory.
    """

    def __init__(self, smap: SampleMap, streams: Sequence[Any], transfers: Sequence[StorageOptions], *,
                 network: bool) -> None:
        self.transfers = tuple(transfers)
        self.network = network
        self._smap = smap
        self._streams = list(streams)
        # Per stream: a remote to check an install against and no validate_hash; a local folder.
        self._usable = [s.remote is not None and not s.validate_hash for s in self._streams]
        self._in_place = [s.remote is not None and scheme_of(s.remote) in ("", "file") for s in self._streams]
        # Per shard, worked out when first asked (a dataset may have 100k shards; a reader asks
        # about the few it is waiting for), except the cheap flags below.
        self._paths: dict[int, str] = {}
        self.any_arriving = any(self.arrives(g) for g in range(len(smap.layouts)))
        self.any_ranged = any(self._ranges(g) for g in range(len(smap.layouts)))

    def _info(self, shard: int) -> ShardInfo:
        return self._smap.indexes[self._smap.shard_stream[shard]].shards[self._smap.shard_local[shard]]

    def cache_path(self, shard: int) -> str:
        """Where ``shard``'s (decompressed) file lives in the cache once installed."""
        path = self._paths.get(shard)
        if path is None:
            s = self._streams[self._smap.shard_stream[shard]]
            path = self._paths[shard] = cache_path(s.local_dir, s.split, self._info(shard).raw_data.basename)
        return path

    def installed(self, shard: int) -> bool:
        """Whether ``shard``'s file is in the cache already (its lease is then a moment away)."""
        return is_installed(self.cache_path(shard), self._info(shard).raw_data.bytes)

    def arrives(self, shard: int) -> bool:
        """Whether ``shard``'s records may be read from its file while it arrives."""
        return self._usable[self._smap.shard_stream[shard]] and isinstance(self._smap.layouts[shard], RecordLayout)

    def _ranges(self, shard: int) -> bool:
        stream = self._smap.shard_stream[shard]
        info = self._info(shard)
        return (self._usable[stream] and (self.network or self._in_place[stream]) and info.zip_data is None
                and info.format == "mds")

    def ranged_url(self, shard: int) -> str | None:
        """The remote URL of ``shard``'s file where its records may be read by range, else None."""
        if not self._ranges(shard):
            return None
        s = self._streams[self._smap.shard_stream[shard]]
        return join_url(s.remote, s.split, self._info(shard).raw_data.basename)

    def decodable(self, shard: int) -> tuple[str, bool] | None:
        """``(source file URL, in a local folder)`` where ``shard`` (a Parquet row group) may be
        decoded before its install, else None."""
        stream = self._smap.shard_stream[shard]
        s, source = self._streams[stream], self._info(shard).source
        if s.remote is None or source is None or not isinstance(self._smap.layouts[shard], ParquetLayout):
            return None
        return join_url(join_url(s.remote, s.split), source.file), self._in_place[stream]

    def turns(self, *, bounded: bool, skips: bool) -> EarlyTurns | None:
        """One reader's early sources (None: its batches come from installed files only)."""
        if bounded or skips:
            return None
        return EarlyTurns(self)


class EarlyTurns:
    """Which early sources one reader still uses: each turns off for good as it stops paying.

    Made by :meth:`SourcePolicy.turns` for one iteration of one reader.
    """

    def __init__(self, policy: SourcePolicy) -> None:
        self.policy = policy
        self._on = {ARRIVING: policy.any_arriving, RANGED: policy.any_ranged, DECODED: True}
        self._off: dict[str, set[int]] = {ARRIVING: set(), RANGED: set(), DECODED: set()}
        self._fetched = False

    def on(self, source: str) -> bool:
        """Whether ``source`` may still serve this reader."""
        return self._on[source]

    def applies(self, source: str, shard: int) -> bool:
        """Whether ``source`` may serve ``shard`` now (by the dataset's policy and this reader's)."""
        if not self._on[source] or shard in self._off[source]:
            return False
        policy = self.policy
        if source == ARRIVING:
            return policy.arrives(shard)
        if source == RANGED:
            # In the cache already: its lease is a moment away.
            return policy.ranged_url(shard) is not None and not policy.installed(shard)
        return True

    def stop(self, source: str) -> None:
        """``source`` serves this reader no more (ranged reads once a batch came from the
        cache or an arriving file; decodings after the first batches)."""
        self._on[source] = False

    def fail(self, source: str, shard: int) -> None:
        """``source`` failed for ``shard``, or spent its budget of it: not again."""
        self._off[source].add(shard)

    def first_fetch(self) -> bool:
        """True the first time it is asked (the reader's first batch that waits for a lease)."""
        first, self._fetched = not self._fetched, True
        return first
