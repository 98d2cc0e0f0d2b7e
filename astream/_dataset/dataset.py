"""``StreamingDataset``: MosaicML Streaming's dataset, without torch.

The dataset holds configuration and the parsed indexes only (it pickles into spawned
workers). Everything that holds resources — the node agent's client, open shard
readers, prefetch tasks — is created lazily in the process and event loop that
iterates, one node client per event loop.
"""

from __future__ import annotations

import asyncio
import os
import threading
import uuid
import weakref
from collections import OrderedDict
from collections.abc import AsyncIterator, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any

import numpy as np

from astream._cache.index_file import load_index
from astream._coord.client import AsyncNodeClient
from astream._coord.config import CoordConfig
from astream._coord.rendezvous import default_run_id
from astream._coord.world import World
from astream._dataset.bridge import SyncIterator
from astream._dataset.iteration import ManagedAsyncIterator
from astream._dataset.layout import SampleMap
from astream._dataset.peek import RemotePeek
from astream._dataset.provider import CacheProviderFactory, EngineSpec, shard_key
from astream._dataset.reader import EpochReader, OpenShards
from astream._dataset.runtime import portal
from astream._dataset.state import EpochState, dataset_fingerprint
from astream._dataset.stream import Stream
from astream._format.index import Index
from astream._sampling.defaults import (
    BATCHING_METHODS,
    PARTITION_ALGOS,
    SAMPLING_METHODS,
    SHUFFLE_ALGOS,
    resolve_num_canonical_nodes,
    resolve_predownload,
)
from astream._sampling.plan import EpochPlan
from astream._sampling.validation import check_choice, check_int, check_optional_int
from astream._storage.config import RemoteConfig
from astream._storage.registry import StoragePool, configure
from astream._units import parse_bytes, parse_count
from astream.errors import ConfigError, SampleIndexError, StateError

__all__ = ["StreamingDataset"]


class StreamingDataset:
    """A dataset streamed from remote or local MDS shards, in MosaicML Streaming's order.

    Parameters keep MosaicML Streaming's names and defaults. Give either ``streams`` or
    ``remote``/``local``/``split`` for a single stream.

    Args:
        streams: several sources mixed together (see :class:`Stream`).
        remote: where the shards live (path, ``file://``, ``http(s)://``, ``s3://``, ``gs://``,
            ``azure://``, ``hf://``, or a scheme a package registered).
        local: the local cache directory (the dataset itself when there is no remote).
        split: a sub-directory of both.
        download_retry: extra attempts per shard download.
        download_timeout: seconds one attempt at one shard may take.
        validate_hash: check every downloaded file with this algorithm.
        keep_zip: keep compressed files beside the decompressed ones.
        epoch_size: samples per epoch (with relative or no stream weights).
        predownload: samples to download ahead (default ``8 * batch_size``, or 64).
        cache_limit: bytes the node's cache may hold (``"10gb"``), or None.
        sampling_method: ``balanced`` or ``fixed``.
        sampling_granularity: samples per pick when a shard is partly drawn.
        partition_algo: ``orig`` or ``relaxed``.
        num_canonical_nodes: default: the number of nodes (64 x that for py1s/py2s).
        batch_size: per-device batch size (the sample order depends on it with loader workers).
        shuffle: whether to shuffle.
        shuffle_algo: ``naive``, ``py1b``, ``py1br``, ``py1e``, ``py1s`` or ``py2s``.
        shuffle_seed: the run's seed.
        shuffle_block_size: default ``max(4_000_000 // num_canonical_nodes, 1 << 18)``.
        batching_method: ``random``, ``stratified``, ``per_stream`` or ``device_per_stream``.
        allow_unsafe_types: allow ``pkl`` columns (unpickling runs code: trust the data).
        replication: consecutive ranks that see the same samples (tensor parallelism).
        max_concurrency: shard transfers in flight per node (astream's own).
        world: this process's place; default from the launcher's environment variables.
        run_id: separates two jobs sharing one cache folder; default from the launcher.
        coord: timeouts of node coordination and where the node agent runs.
        storage_options: settings of the remote's backend (endpoint, credentials, headers...),
            for ``remote=`` and for the streams that give none; see :class:`Stream`.

    Raises:
        ConfigError: a bad parameter (before anything is downloaded).
        IndexFormatError, DownloadError: an index could not be fetched or parsed.
    """

    def __init__(
        self,
        *,
        streams: Sequence[Stream] | None = None,
        remote: str | None = None,
        local: str | None = None,
        split: str | None = None,
        download_retry: int = 2,
        download_timeout: float = 60.0,
        validate_hash: str | None = None,
        keep_zip: bool = False,
        epoch_size: int | str | None = None,
        predownload: int | None = None,
        cache_limit: int | str | None = None,
        sampling_method: str = "balanced",
        sampling_granularity: int = 1,
        partition_algo: str = "relaxed",
        num_canonical_nodes: int | None = None,
        batch_size: int | None = None,
        shuffle: bool = False,
        shuffle_algo: str = "py1e",
        shuffle_seed: int = 9176,
        shuffle_block_size: int | None = None,
        batching_method: str = "random",
        allow_unsafe_types: bool = False,
        replication: int | None = None,
        max_concurrency: int = 8,
        world: World | None = None,
        run_id: str | None = None,
        coord: CoordConfig | None = None,
        storage_options: Mapping[str, Any] | None = None,
    ) -> None:
        self.shuffle = bool(shuffle)
        self.shuffle_algo = check_choice("shuffle_algo", shuffle_algo, SHUFFLE_ALGOS)
        self.shuffle_seed = check_int("shuffle_seed", shuffle_seed, 0)
        self.shuffle_block_size = check_optional_int("shuffle_block_size", shuffle_block_size, 1)
        self.partition_algo = check_choice("partition_algo", partition_algo, PARTITION_ALGOS)
        self.sampling_method = check_choice("sampling_method", sampling_method, SAMPLING_METHODS)
        self.sampling_granularity = check_int("sampling_granularity", sampling_granularity, 1)
        self.batching_method = check_choice("batching_method", batching_method, BATCHING_METHODS)
        self.num_canonical_nodes = check_optional_int("num_canonical_nodes", num_canonical_nodes, 1)
        self.batch_size = check_optional_int("batch_size", batch_size, 1)
        self.predownload = check_optional_int("predownload", predownload, 0)
        self.max_concurrency = check_int("max_concurrency", max_concurrency, 1)
        self.download_retry = check_int("download_retry", download_retry, 0)
        if isinstance(download_timeout, bool) or not isinstance(download_timeout, (int, float)) or download_timeout <= 0:
            raise ConfigError(f"download_timeout must be a number of seconds > 0, got {download_timeout!r}")
        self.download_timeout = float(download_timeout)
        self.cache_limit = None if cache_limit is None else parse_bytes(cache_limit, "cache_limit")
        self.epoch_size = None if epoch_size is None else parse_count(epoch_size, "epoch_size")
        self.allow_unsafe_types = bool(allow_unsafe_types)
        self.keep_zip = bool(keep_zip)
        self.validate_hash = validate_hash
        self.coord = coord

        unique_world = world if world is not None else World.from_env()
        self.replication = check_optional_int("replication", replication, 1)
        self.unique_world = unique_world
        self.world = _parallel_world(unique_world, self.replication)
        self.run_id = run_id if run_id is not None else (default_run_id() or f"solo-{os.getpid()}-{uuid.uuid4().hex[:8]}")

        if streams is not None:
            if remote is not None or local is not None or split is not None:
                raise ConfigError("give either streams= or remote=/local=/split=, not both")
            if not streams or not all(isinstance(s, Stream) for s in streams):
                raise ConfigError("streams must be a non-empty list of astream.Stream")
            given = list(streams)
        else:
            given = [Stream(remote=remote, local=local, split=split, storage_options=storage_options)]
        self.storage_options = RemoteConfig.of(storage_options)
        self.streams = [
            s.inherit(download_retry=self.download_retry, download_timeout=self.download_timeout,
                      validate_hash=validate_hash, keep_zip=self.keep_zip, storage_options=self.storage_options)
            for s in given
        ]
        for s in self.streams:
            if s.remote is not None:
                configure(s.remote, s.storage_options)  # an unknown key fails here, before any I/O
        relative = [s.proportion is not None for s in self.streams]
        if any(relative) and not all(relative):
            raise ConfigError("either every stream sets proportion or none does; mixing proportion "
                              "with repeat/choose/unweighted streams is ambiguous")
        if self.epoch_size is not None and any(s.repeat is not None or s.choose is not None for s in self.streams):
            raise ConfigError("epoch_size cannot be combined with streams that set repeat or choose")

        self.indexes: list[Index] = portal().call(self._aload_indexes())
        self.sample_map = SampleMap(self.indexes, self.allow_unsafe_types)
        self.fingerprint = dataset_fingerprint([
            {"shards": [(sh.raw_data.basename, sh.samples, sh.raw_data.bytes) for sh in index.shards],
             "proportion": s.proportion, "repeat": s.repeat, "choose": s.choose}
            for s, index in zip(self.streams, self.indexes, strict=True)
        ])
        # Run-wide values fixed at the first iteration (or by a loaded state), as MosaicML does.
        self._resume: EpochState | None = None
        self._run_ncn: int | None = None
        self._run_seed: int = self.shuffle_seed
        self._initial_physical_nodes: int | None = None
        self._epoch: int = 0
        self._epoch_offset: int = 0
        self._peek_network = True  # this process may read ahead of downloads over the network
        self._init_process_state()
        self.plan(epoch=0, sample_in_epoch=0, workers_per_rank=1)  # validate the whole config now

    # -- pickling: configuration travels, resources do not ----------------------------------

    def _init_process_state(self) -> None:
        self._clients: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, AsyncNodeClient] = (
            weakref.WeakKeyDictionary()
        )
        self._shards = OpenShards(self.sample_map)
        self._peek_sources: list[tuple[str, str] | None] | bool | None = False  # False: not worked out yet
        self._plans: OrderedDict[tuple[Any, ...], EpochPlan] = OrderedDict()
        self._plans_lock = threading.Lock()

    def __getstate__(self) -> dict[str, Any]:
        state = dict(self.__dict__)
        # The sample map holds compiled record layouts; it is rebuilt from the indexes.
        for name in ("_clients", "_shards", "sample_map", "_plans", "_plans_lock", "_peek_sources"):
            del state[name]
        return state

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self.sample_map = SampleMap(self.indexes, self.allow_unsafe_types)
        self._init_process_state()
        # A loader's worker process: read ahead of downloads from local-directory remotes
        # only (importing the HTTP client here would cost more than the wait it saves).
        self._peek_network = False

    # -- indexes -----------------------------------------------------------------------------

    async def _aload_indexes(self) -> list[Index]:
        async def one(s: Stream) -> Index:
            if s.remote is None or not s.remote_config:
                return await load_index(s.local_dir, s.remote, s.split)
            async with StoragePool(configure(s.remote, s.remote_config)) as pool:
                return await load_index(s.local_dir, s.remote, s.split, pool=pool)

        return list(await asyncio.gather(*(one(s) for s in self.streams)))

    # -- shape -------------------------------------------------------------------------------

    @property
    def size(self) -> int:
        """Underlying samples, summed over streams."""
        return self.sample_map.num_samples

    @property
    def num_samples(self) -> int:
        return self.size

    @property
    def columns(self) -> dict[str, str]:
        """Column name -> encoding, of the first stream's first shard."""
        layout = self.sample_map.layouts[0] if self.sample_map.layouts else None
        return {} if layout is None else dict(zip(layout.names, layout.specs, strict=True))

    @property
    def current_epoch(self) -> int:
        """The epoch this process iterates (or last iterated, or a loaded state resumes)."""
        return self._resume.epoch if self._resume is not None else self._epoch

    def __len__(self) -> int:
        """This rank's samples per epoch: ``ceil(epoch_size / ranks)``, as MosaicML reports it."""
        return self.plan(epoch=self._epoch, sample_in_epoch=0, workers_per_rank=1).rank_len

    def plan(self, *, epoch: int, sample_in_epoch: int, workers_per_rank: int, batch_size: int | None = None) -> EpochPlan:
        """The epoch plan for this dataset, world and run state.

        ``batch_size`` is used only when the dataset has none (a loader's batch size).
        """
        ncn = self._run_ncn if self._run_ncn is not None else self.num_canonical_nodes
        key = (epoch, sample_in_epoch, workers_per_rank, self.batch_size or batch_size or 1, ncn, self._run_seed,
               self._initial_physical_nodes)
        with self._plans_lock:
            plan = self._plans.get(key)
            if plan is not None:
                self._plans.move_to_end(key)
                return plan
        plan = EpochPlan(
            [{"shard_sizes": sizes, "proportion": s.proportion, "repeat": s.repeat, "choose": s.choose}
             for s, sizes in zip(self.streams, self.sample_map.stream_shard_sizes(), strict=True)],
            shuffle=self.shuffle, shuffle_algo=self.shuffle_algo, shuffle_seed=self._run_seed,
            num_canonical_nodes=ncn, shuffle_block_size=self.shuffle_block_size,
            partition_algo=self.partition_algo, batch_size=self.batch_size or batch_size or 1,
            num_physical_nodes=self.world.num_nodes, ranks_per_node=self.world.ranks_per_node,
            workers_per_rank=workers_per_rank, epoch=epoch, sample_in_epoch=sample_in_epoch,
            initial_physical_nodes=self._initial_physical_nodes, epoch_size=self.epoch_size,
            sampling_method=self.sampling_method, sampling_granularity=self.sampling_granularity,
            batching_method=self.batching_method,
        )
        # A plan caches the epoch's shuffle, which every query of the epoch (len, batch_ids,
        # the reader) shares; recomputing it costs tens of milliseconds per call.
        with self._plans_lock:
            self._plans[key] = plan
            while len(self._plans) > 4:
                self._plans.popitem(last=False)
        return plan

    def resolved_predownload(self, batch_size: int | None = None) -> int:
        value = resolve_predownload(self.predownload, batch_size or self.batch_size)
        return max(value, batch_size or self.batch_size or 1)

    # -- the node --------------------------------------------------------------------------

    def _coord_config(self) -> CoordConfig:
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

    def _provider(self) -> CacheProviderFactory:
        total = sum(max(1, sum(sh.raw_data.bytes for sh in index.shards)) for index in self.indexes)
        specs = []
        for s, index in zip(self.streams, self.indexes, strict=True):
            limit = None
            if self.cache_limit is not None:
                # One node-wide limit, shared by the streams in proportion to their size.
                share = max(1, sum(sh.raw_data.bytes for sh in index.shards)) / total
                limit = max(1, int(self.cache_limit * share))
            specs.append(EngineSpec(
                local=s.local_dir, remote=s.remote, split=s.split, validate_hash=s.validate_hash,
                keep_zip=bool(s.keep_zip), download_retry=int(s.download_retry or 0),
                download_timeout=float(s.download_timeout or self.download_timeout), cache_limit=limit,
                storage_options=s.remote_config,
            ))
        return CacheProviderFactory(tuple(specs), self.max_concurrency)

    async def node(
        self, worker: int = 0, workers_per_rank: int = 1, *, role: str = "main"
    ) -> AsyncNodeClient:
        """This process's client of the node agent, for the running event loop.

        Args:
            worker, workers_per_rank: this process's loader-worker place (``role="worker"``).
            role: ``"main"`` for a rank's own process (named ``rank<r>.main`` at the node's
                barriers), ``"worker"`` for a loader worker (``rank<r>.worker<w>``).
        """
        loop = asyncio.get_running_loop()
        client = self._clients.get(loop)
        if client is None:
            world = self.unique_world.with_worker(worker, workers_per_rank)
            client = AsyncNodeClient(
                self.streams[0].local_dir, self._provider(), run_id=self.run_id, world=world,
                member=_main_member(world.rank) if role == "main" else world.member,
                config=self._coord_config(),
            )
            # Registered before it connects, so concurrent callers share one client.
            self._clients[loop] = client
            try:
                await client.aconnect()
            except BaseException:
                if self._clients.get(loop) is client:
                    del self._clients[loop]
                await client.aclose()
                raise
        return client

    async def aclose(self) -> None:
        """Leave the node (for this event loop) and close open shards; idempotent."""
        client = self._clients.pop(asyncio.get_running_loop(), None)
        if client is not None:
            await client.aclose()

    def close(self) -> None:
        """Leave the node from sync code and close open shards; idempotent."""
        portal().call(self.aclose())
        self._shards.close()

    # -- epochs and resumption ---------------------------------------------------------------

    async def begin_epoch(self, node: AsyncNodeClient) -> tuple[int, int]:
        """Start an iteration: agree on the epoch with the node's ranks; return (epoch, offset).

        A loaded state resumes its epoch at its ``sample_in_epoch`` (also after this dataset
        iterated already, which MosaicML would silently ignore).
        """
        resume, self._resume = self._resume, None
        if self._run_ncn is None:
            self._run_ncn = resolve_num_canonical_nodes(self.num_canonical_nodes, self.shuffle_algo,
                                                       self.world.num_nodes)
        if self._initial_physical_nodes is None:
            self._initial_physical_nodes = self.world.num_nodes
        first = self.unique_world.node * self.unique_world.ranks_per_node
        parties = [_main_member(r) for r in range(first, first + self.unique_world.ranks_per_node)]
        if resume is not None:
            await node.set_epoch(resume.epoch)
        epoch = await node.begin_epoch(parties)
        offset = resume.sample_in_epoch if resume is not None and resume.epoch == epoch else 0
        self._epoch, self._epoch_offset = epoch, offset
        return epoch, offset

    def state_dict(self, num_samples: int, from_beginning: bool) -> dict[str, Any]:
        """The resumable state after ``num_samples`` samples of the current epoch (all ranks).

        Args:
            num_samples: samples consumed across all ranks.
            from_beginning: count from the start of the epoch (Composer) rather than from
                where this run resumed (MosaicML's StreamingDataLoader).
        """
        if self._resume is not None:
            epoch, offset = self._resume.epoch, self._resume.sample_in_epoch
        else:
            epoch, offset = self._epoch, self._epoch_offset
        ncn = self._run_ncn or resolve_num_canonical_nodes(self.num_canonical_nodes, self.shuffle_algo,
                                                           self.world.num_nodes)
        sample = num_samples if from_beginning else offset + num_samples
        return EpochState(epoch, sample, ncn, self._run_seed,
                          self._initial_physical_nodes or self.world.num_nodes, self.fingerprint).to_dict()

    def load_state_dict(self, obj: Any) -> None:
        """Resume from a state (astream's or MosaicML's) at the next iteration.

        Raises:
            StateError: missing keys, wrong types, another dataset, a position past the
                epoch, or a world the state cannot be resumed on.
        """
        state = EpochState.from_dict(obj)
        state.check_fingerprint(self.fingerprint)
        saved = (self._run_ncn, self._run_seed, self._initial_physical_nodes)
        self._run_ncn, self._run_seed = state.num_canonical_nodes, state.shuffle_seed
        self._initial_physical_nodes = state.initial_physical_nodes
        try:
            epoch_size = self.plan(epoch=state.epoch, sample_in_epoch=0, workers_per_rank=1).epoch_size
            if state.sample_in_epoch > epoch_size:
                raise StateError(
                    f"sample_in_epoch={state.sample_in_epoch} is past the end of the epoch ({epoch_size} "
                    "samples); this state belongs to another dataset or epoch_size"
                )
            self.plan(epoch=state.epoch, sample_in_epoch=state.sample_in_epoch, workers_per_rank=1)
        except ConfigError as exc:
            self._run_ncn, self._run_seed, self._initial_physical_nodes = saved
            raise StateError(f"cannot resume this state on the current world: {exc}") from exc
        except StateError:
            self._run_ncn, self._run_seed, self._initial_physical_nodes = saved
            raise
        self._resume = state

    # -- iteration ---------------------------------------------------------------------------

    @asynccontextmanager
    async def open_epoch_reader(
        self, epoch: int, offset: int, *, worker: int, workers_per_rank: int, batch_size: int | None,
    ) -> AsyncIterator[EpochReader]:
        """A reader of one worker's samples of an epoch that starts ``offset`` samples in."""
        node = await self.node(worker, workers_per_rank, role="worker")
        plan = self.plan(epoch=epoch, sample_in_epoch=offset, workers_per_rank=workers_per_rank,
                         batch_size=batch_size)
        ids = plan.worker_ids(self.world.node, self.world.local_rank, worker)
        ids = ids[ids >= 0]
        async with EpochReader(node, self.sample_map, ids, self.resolved_predownload(batch_size),
                               self.max_concurrency, self._shards, peek=self._remote_peek()) as reader:
            yield reader

    def _remote_peek(self) -> RemotePeek | None:
        """Ranged reads of shards still downloading, for one reader (see :mod:`astream._dataset.peek`)."""
        if self._peek_sources is False:
            self._peek_sources = RemotePeek.sources_of(self.sample_map, self.streams, network=self._peek_network)
        sources = self._peek_sources
        if not isinstance(sources, list):
            return None
        return RemotePeek(self.sample_map, sources, [s.remote_config for s in self.streams])

    @asynccontextmanager
    async def _sample_stream(self, chunked: bool) -> AsyncIterator[AsyncIterator[Any]]:
        node = await self.node()
        epoch, offset = await self.begin_epoch(node)
        async with self.open_epoch_reader(epoch, offset, worker=0, workers_per_rank=1,
                                          batch_size=self.batch_size) as reader:
            yield reader.chunks() if chunked else reader.samples()

    def __aiter__(self) -> ManagedAsyncIterator[dict[str, Any]]:
        """``async for sample in ds``: this rank's samples of the next epoch."""
        return ManagedAsyncIterator(self._sample_stream(chunked=False))

    def __iter__(self) -> Iterator[dict[str, Any]]:
        """``for sample in ds``: this rank's samples of the next epoch."""
        chunks = SyncIterator(portal(), lambda: self._sample_stream(chunked=True), maxsize=4)
        try:
            for chunk in chunks:
                yield from chunk
        finally:
            chunks.close()

    # -- random access -----------------------------------------------------------------------

    def _check_index(self, index: int) -> int:
        if isinstance(index, (bool, np.bool_)) or not isinstance(index, (int, np.integer)):
            raise ConfigError(f"sample index must be an int, got {type(index).__name__}")
        size = self.size
        i = int(index) + size if index < 0 else int(index)
        if not 0 <= i < size:
            raise SampleIndexError(f"sample {index} is out of range for a dataset of {size} samples")
        return i

    def _check_indexes(self, ids: Sequence[int] | np.ndarray) -> np.ndarray:
        """Validate sample indexes at once (negative ones count from the end)."""
        raw = np.asarray(ids)
        if raw.size and (raw.dtype.kind not in "iu" or raw.dtype == np.bool_):
            raise ConfigError(f"sample indexes must be integers, got an array of {raw.dtype}")
        array = raw.reshape(-1).astype(np.int64)
        size = self.size
        array = np.where(array < 0, array + size, array)
        bad = np.flatnonzero((array < 0) | (array >= size))
        if bad.size:
            raise SampleIndexError(
                f"sample {raw.reshape(-1)[bad[0]]} is out of range for a dataset of {size} samples"
            )
        return array

    async def aget(self, index: int) -> dict[str, Any]:
        """Sample ``index`` (global over streams), fetching its shard if needed."""
        i = self._check_index(index)
        shard, offset = self.sample_map.locate_one(i)
        node = await self.node()
        key = shard_key(self.sample_map.shard_stream[shard], self.sample_map.shard_local[shard])
        path = await node.ensure(key, pin=True)
        try:
            return self._shards.get(shard, path).get(offset)
        finally:
            await node.unpin(key)

    def __getitem__(self, index: int) -> dict[str, Any]:
        return portal().call(self.aget(index))

    async def aget_batch(self, ids: Sequence[int] | np.ndarray) -> dict[str, Any]:
        """Samples ``ids`` as one batch (dict of arrays/lists), fetching shards as needed."""
        array = self._check_indexes(ids)
        node = await self.node()
        async with EpochReader(node, self.sample_map, array, max(1, len(array)), self.max_concurrency,
                               self._shards) as reader:
            batches = [b async for b in reader.batches(max(1, len(array)), drop_last=False)]
        return batches[0] if batches else {}

    def get_batch(self, ids: Sequence[int] | np.ndarray) -> dict[str, Any]:
        return portal().call(self.aget_batch(ids))

    def __repr__(self) -> str:
        where = ", ".join(s.remote or s.local_dir for s in self.streams)
        return f"<StreamingDataset {where}: {self.size} samples, {len(self.streams)} stream(s)>"


def _main_member(rank: int) -> str:
    """The name of a rank's own process at the node's barriers (workers are ``rank<r>.worker<w>``)."""
    return f"rank{rank}.main"


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

