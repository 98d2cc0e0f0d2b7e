"""``DatasetConfig``: a :class:`StreamingDataset`'s parameters, validated once and frozen.

Built once by the dataset's constructor and passed down whole (never as loose
keywords): the plan options, what the node agent's cache engines need
(:meth:`DatasetConfig.provider`), and how this process joins its node
(:meth:`DatasetConfig.coord_config`) all come from this one object. It is hashable and
picklable, so it travels to worker processes as it is.
"""

from __future__ import annotations

import logging
import os
import warnings
from collections.abc import Callable, Hashable, Mapping, MutableMapping, Sequence
from dataclasses import dataclass
from typing import Any

from astream._checks import check_choice, check_int, check_optional_int, check_seconds
from astream._coord.config import CoordConfig
from astream._coord.rendezvous import resolve_run_id
from astream._coord.world import World, detect_world
from astream._dataset.mixture import (
    WEIGHTS,
    MixtureEntry,
    MixtureHistory,
    StreamEntry,
    place_digest,
    plan_changed,
)
from astream._dataset.quarantine import RAISE, BadSamplePolicy, Quarantine
from astream._dataset.state import fingerprint_of
from astream._dataset.stream import Stream
from astream._format.columns import columns_of, shard_identity
from astream._format.index import Index
from astream._node.provider import CacheProviderFactory, EngineSpec
from astream._sampling.defaults import (
    BATCHING_METHODS,
    PARTITION_ALGOS,
    SAMPLING_METHODS,
    SHUFFLE_ALGOS,
    resolve_predownload,
)
from astream._sampling.options import PlanOptions
from astream._sampling.plan import EpochPlan
from astream._sampling.remix import Mixture, Seen
from astream._storage.config import EMPTY, RemoteConfig
from astream._storage.registry import configure
from astream._units import parse_bytes, parse_count
from astream.errors import ConfigError

__all__ = ["DatasetConfig", "shard_identity"]

MIXTURE_CHANGES = ("raise", "continue")

log = logging.getLogger("astream.coord")
_logged: set[tuple[World, str, str, str]] = set()


@dataclass(frozen=True)
class DatasetConfig:
    """Every parameter of a dataset, validated; see :class:`StreamingDataset` for each."""

    streams: tuple[Stream, ...]
    download_retry: int
    download_timeout: float
    validate_hash: str | None
    keep_zip: bool
    epoch_size: int | None
    predownload: int | None
    cache_limit: int | None
    sampling_method: str
    sampling_granularity: int
    partition_algo: str
    num_canonical_nodes: int | None
    batch_size: int | None
    shuffle: bool
    shuffle_algo: str
    shuffle_seed: int
    shuffle_block_size: int | None
    batching_method: str
    allow_unsafe_types: bool
    replication: int | None
    max_concurrency: int
    unique_world: World
    world: World  # the world the order is computed for (replicas share a rank)
    run_id: str
    coord: CoordConfig | None
    transform: Callable[[Any], Any] | None = None
    storage_options: RemoteConfig = EMPTY
    bad_samples: BadSamplePolicy = RAISE
    quarantine: str | tuple[int, ...] | None = None  # resolved to ids once the indexes are read
    on_mixture_change: str = "raise"

    @classmethod
    def build(
        cls, *, streams: Sequence[Stream] | None, remote: str | None, local: str | None, split: str | None,
        download_retry: int, download_timeout: float, validate_hash: str | None, keep_zip: bool,
        epoch_size: int | str | None, predownload: int | None, cache_limit: int | str | None,
        sampling_method: str, sampling_granularity: int, partition_algo: str, num_canonical_nodes: int | None,
        batch_size: int | None, shuffle: bool, shuffle_algo: str, shuffle_seed: int,
        shuffle_block_size: int | None, batching_method: str, allow_unsafe_types: bool,
        replication: int | None, max_concurrency: int, world: World | None, run_id: str | None,
        coord: CoordConfig | None, transform: Callable[[Any], Any] | None = None,
        storage_options: Mapping[str, Any] | None = None, format: str | None = None,
        columns: Sequence[str] | None = None, stream_name: str = "stream",
        stream_config: Mapping[str, Any] | None = None, on_mixture_change: str = "raise",
        on_bad_sample: str = "raise", max_bad_samples: int | float | None = None,
        skip_exceptions: Sequence[type[BaseException]] | None = None, quarantine: Quarantine = None,
    ) -> DatasetConfig:
        """Validate the constructor's keywords.

        Raises:
            ConfigError: the first bad parameter, named, with what it may be.
        """
        retry = check_int("download_retry", download_retry, 0)
        timeout = check_seconds("download_timeout", download_timeout)
        keep = bool(keep_zip)
        if streams is not None:
            if remote is not None or local is not None or split is not None:
                raise ConfigError("give either streams= or remote=/local=/split=, not both")
            if not streams or not all(isinstance(s, Stream) for s in streams):
                raise ConfigError("streams must be a non-empty list of astream.Stream")
            if format is not None or columns is not None:
                raise ConfigError("with streams=, give format= and columns= to each Stream")
            if stream_config is not None:
                raise ConfigError("stream_config= sets the stream made from remote=/local=; with streams=, give "
                                  "each Stream its own weight")
            _check_stream_name(stream_name)
            given = list(streams)
        else:
            if validate_hash is not None and format not in (None, "mds"):
                raise ConfigError(f"validate_hash does not apply to format={format!r} (its files carry no digests "
                                  "in an index); leave it None")
            given = [Stream(remote=remote, local=local, split=split, storage_options=storage_options,
                            format=format or "mds", columns=None if columns is None else tuple(columns),
                            **_stream_weight(stream_name, stream_config))]
        options = RemoteConfig.of(storage_options)
        inherited = tuple(s.inherit(download_retry=retry, download_timeout=timeout, validate_hash=validate_hash,
                                    keep_zip=keep, storage_options=options) for s in given)
        for s in inherited:
            if s.remote is not None:
                configure(s.remote, s.storage_options)  # an unknown key fails here, before any I/O
        relative = [s.proportion is not None for s in inherited]
        if any(relative) and not all(relative):
            raise ConfigError("either every stream sets proportion or none does; mixing proportion "
                              "with repeat/choose/unweighted streams is ambiguous")
        size = None if epoch_size is None else parse_count(epoch_size, "epoch_size")
        if size is not None and any(s.repeat is not None or s.choose is not None for s in inherited):
            raise ConfigError("epoch_size cannot be combined with streams that set repeat or choose")
        on_change = check_choice("on_mixture_change", on_mixture_change, MIXTURE_CHANGES)
        if on_change == "continue" and batching_method != "random":
            raise ConfigError(f"on_mixture_change='continue' plans the rest of a changed epoch for "
                              f"batching_method='random' only, not {batching_method!r}")
        unique_world, world_source = (world, "world=") if world is not None else detect_world()
        run, run_source = resolve_run_id(run_id, unique_world.ranks_per_node)
        _log_once(unique_world, world_source, run, run_source)
        replicas = check_optional_int("replication", replication, 1)
        ahead = check_optional_int("predownload", predownload, 0)
        per_batch = check_optional_int("batch_size", batch_size, 1)
        if ahead is not None and per_batch is not None and ahead < per_batch:
            # MosaicML's warning; astream's reader reads a batch ahead all the same (see lookahead).
            warnings.warn(f"predownload < batch_size ({ahead} < {per_batch}): set predownload to at least "
                          "batch_size, or leave it None (8 * batch_size); astream downloads one batch ahead "
                          "at the least anyway", UserWarning, stacklevel=3)
        return cls(
            streams=inherited, download_retry=retry, download_timeout=timeout, validate_hash=validate_hash,
            keep_zip=keep, epoch_size=size, predownload=ahead,
            cache_limit=None if cache_limit is None else parse_bytes(cache_limit, "cache_limit"),
            sampling_method=check_choice("sampling_method", sampling_method, SAMPLING_METHODS),
            sampling_granularity=check_int("sampling_granularity", sampling_granularity, 1),
            partition_algo=check_choice("partition_algo", partition_algo, PARTITION_ALGOS),
            num_canonical_nodes=check_optional_int("num_canonical_nodes", num_canonical_nodes, 1),
            batch_size=per_batch, shuffle=bool(shuffle),
            shuffle_algo=check_choice("shuffle_algo", shuffle_algo, SHUFFLE_ALGOS),
            shuffle_seed=check_int("shuffle_seed", shuffle_seed, 0),
            shuffle_block_size=check_optional_int("shuffle_block_size", shuffle_block_size, 1),
            batching_method=check_choice("batching_method", batching_method, BATCHING_METHODS),
            allow_unsafe_types=bool(allow_unsafe_types), replication=replicas,
            max_concurrency=check_int("max_concurrency", max_concurrency, 1), unique_world=unique_world,
            world=_parallel_world(unique_world, replicas),
            run_id=run,
            coord=coord, transform=_check_transform(transform), storage_options=options,
            bad_samples=BadSamplePolicy.build(on_bad_sample, max_bad_samples, skip_exceptions, quarantine is not None),
            quarantine=_quarantine_source(quarantine),
            on_mixture_change=on_change,
        )

    def epoch_plan(
        self, shard_sizes: Sequence[Any], *, num_canonical_nodes: int | None, shuffle_seed: int,
        initial_physical_nodes: int | None, epoch: int, sample_in_epoch: int, workers_per_rank: int,
        batch_size: int, history: tuple[Sequence[Mixture], str, MutableMapping[Hashable, Seen]] | None = None,
    ) -> EpochPlan:
        """The plan of one epoch for these parameters and the run values given; with the
        ``history`` of an epoch whose mixture changed (its digest, and where what its earlier
        segments delivered is kept), of its current segment (see remix.py)."""
        options = PlanOptions(
            batch_size=batch_size, shuffle=self.shuffle, shuffle_algo=self.shuffle_algo, shuffle_seed=shuffle_seed,
            num_canonical_nodes=num_canonical_nodes, shuffle_block_size=self.shuffle_block_size,
            partition_algo=self.partition_algo, num_physical_nodes=self.world.num_nodes,
            ranks_per_node=self.world.ranks_per_node, workers_per_rank=workers_per_rank, epoch=epoch,
            sample_in_epoch=sample_in_epoch, initial_physical_nodes=initial_physical_nodes,
            epoch_size=self.epoch_size, sampling_method=self.sampling_method,
            sampling_granularity=self.sampling_granularity, batching_method=self.batching_method,
        )
        if history:
            mixtures, token, seen = history
            return plan_changed(mixtures, token, options, seen)
        return EpochPlan.of(
            [{"shard_sizes": sizes, "proportion": s.proportion, "repeat": s.repeat, "choose": s.choose}
             for s, sizes in zip(self.streams, shard_sizes, strict=True)], options)

    def mixture(self, indexes: Sequence[Index]) -> MixtureHistory:
        """This dataset's mixture as a state records it (one mixture, from sample 0)."""
        streams: dict[str, StreamEntry] = {}
        weights = []
        for s, index in zip(self.streams, indexes, strict=True):
            where = s.remote or s.local_dir
            place = place_digest(where, s.split)
            cols = columns_of(index)
            key = base = f"{cols.identity_xxh64}@{place}"  # (stream_key of its shards' identities)
            while key in streams:  # the same stream twice: each occurrence its own
                key = f"{base}#{len(streams)}"
            streams[key] = StreamEntry(key, place, cols.samples,
                                       name=f"{where}{'/' + s.split if s.split else ''}")
            kind = next((w for w in WEIGHTS if getattr(s, w) is not None), None)
            weights.append((kind, None if kind is None else getattr(s, kind)))
        entry = MixtureEntry(tuple(streams), tuple(weights), self.epoch_size, 0)
        return MixtureHistory(streams, (entry,))

    def fingerprint(self, indexes: Sequence[Index]) -> str:
        """What a resumable state must match: the shards and the streams' weights."""
        return fingerprint_of([(columns_of(index), {"proportion": s.proportion, "repeat": s.repeat,
                                                     "choose": s.choose})
                               for s, index in zip(self.streams, indexes, strict=True)])

    def resolved_predownload(self, batch_size: int | None = None) -> int:
        """MosaicML's ``predownload`` (the reader widens it to one read, see ``lookahead``)."""
        return resolve_predownload(self.predownload, batch_size or self.batch_size)

    def coord_config(self) -> CoordConfig:
        """How this process joins its node (the agent's timeouts and where it runs)."""
        if self.coord is not None:
            return self.coord
        # The only rank of its node: the agent lives on a thread of it, also when the rank
        # starts loader worker processes (they reach it over the socket all the same, and
        # die with the rank anyway). No interpreter to start: the first batch of a warm
        # Loader(num_workers=2) came after 0.21 s with the agent in a process of its own,
        # after 0.03 s with it on a thread (medians of 7). Several ranks on a node: its own
        # process, so that it outlives whichever rank ends first and no rank's Python
        # work slows the others' requests.
        alone = self.unique_world.ranks_per_node == 1
        return CoordConfig(agent_mode="thread" if alone else "process")

    def provider(self, indexes: Sequence[Index]) -> CacheProviderFactory:
        """What the node agent builds its cache engines from (one per stream)."""
        stream_bytes = [max(1, int(columns_of(index).raw_bytes.sum())) for index in indexes]
        total = sum(stream_bytes)
        specs = []
        for s, size in zip(self.streams, stream_bytes, strict=True):
            limit = None
            if self.cache_limit is not None:
                # One node-wide limit, shared by the streams in proportion to their size.
                share = size / total
                limit = max(1, int(self.cache_limit * share))
            specs.append(EngineSpec(
                local=s.local_dir, remote=s.remote, split=s.split, validate_hash=s.validate_hash,
                keep_zip=bool(s.keep_zip), download_retry=int(s.download_retry or 0),
                download_timeout=float(s.download_timeout or self.download_timeout), cache_limit=limit,
                storage_options=s.remote_config,
            ))
        # pinned_at_once=1: readers of a bounded cache pin one batch each (checked, with the
        # node's readers, by check_dataset_cache at the start of an epoch).
        return CacheProviderFactory(tuple(specs), self.max_concurrency, pinned_at_once=1, indexes=tuple(indexes))


_STREAM_WEIGHTS = ("proportion", "repeat", "choose")


def _check_stream_name(stream_name: object) -> None:
    """MosaicML 0.13's ``stream_name`` picks a registered ``Stream`` subclass; only its own
    default exists here (astream's downloads are the node agent's, so a subclass's download
    methods would never run)."""
    if stream_name != "stream":
        raise ConfigError(
            f"stream_name={stream_name!r}: astream has no registry of Stream subclasses (MosaicML's "
            "streams_registry); downloads are the node agent's, so a subclass's download methods would not "
            "run. Give streams=[astream.Stream(...)], and change samples with transform= or a StreamingDataset "
            "subclass's __getitem__"
        )


def _stream_weight(stream_name: object, stream_config: Mapping[str, Any] | None) -> dict[str, Any]:
    """The keywords ``stream_config`` adds to the dataset's one stream: its weight."""
    _check_stream_name(stream_name)
    if stream_config is None:
        return {}
    if not isinstance(stream_config, Mapping):
        raise ConfigError(f"stream_config must be a dict of Stream keywords, got {type(stream_config).__name__}")
    unknown = sorted(set(stream_config) - set(_STREAM_WEIGHTS))
    if unknown:
        raise ConfigError(
            f"stream_config holds {', '.join(map(repr, unknown))}: it takes the stream's weight "
            f"({', '.join(_STREAM_WEIGHTS)}); give remote, local, split and the download settings to "
            "StreamingDataset itself (MosaicML overwrites them with the dataset's)"
        )
    return dict(stream_config)


def _check_transform(transform: Any) -> Callable[[Any], Any] | None:
    if transform is not None and not callable(transform):
        raise ConfigError(f"transform must be a function of one sample, got {type(transform).__name__}")
    return transform  # type: ignore[no-any-return]


def _parallel_world(world: World, replication: int | None) -> World:
    """The world the sample order is computed for: replicas of ``replication`` ranks share."""
    if replication is None or replication == 1:
        return world
    if world.world_size % replication:
        raise ConfigError(f"replication={replication} must divide the world size {world.world_size}")
    ranks = world.world_size // replication
    nodes = ranks // world.ranks_per_node if ranks % world.ranks_per_node == 0 else 1
    per_node = ranks // nodes
    rank = world.rank // replication
    return World(rank=rank, world_size=ranks, local_rank=rank % per_node, ranks_per_node=per_node,
                 worker=world.worker, workers_per_rank=world.workers_per_rank)


def _log_once(world: World, world_source: str, run_id: str, run_source: str) -> None:
    """Say (at debug level, once per process and outcome) where this process stands and why."""
    key = (world, world_source, run_id, run_source)
    if key in _logged:
        return
    _logged.add(key)
    log.debug(
        "world from %s: rank %d of %d, node %d of %d, local rank %d of %d; run id %r from %s",
        world_source, world.rank, world.world_size, world.node, world.num_nodes, world.local_rank,
        world.ranks_per_node, run_id, run_source,
    )


def _quarantine_source(given: Quarantine) -> str | tuple[int, ...] | None:
    """``quarantine=`` as the config keeps it: a file's path, or the ids (hashable, picklable)."""
    if given is None or isinstance(given, (str, os.PathLike)):
        return None if given is None else os.fspath(given)
    try:
        return tuple(sorted({int(i) for i in given}))
    except (TypeError, ValueError) as exc:
        raise ConfigError(f"quarantine= takes a quarantine file's path or sample ids, got {given!r}") from exc

