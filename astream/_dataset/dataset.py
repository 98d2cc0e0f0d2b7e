"""``StreamingDataset``: MosaicML Streaming's dataset, without torch.

The class users see is a facade over parts with one job each: the frozen, validated
:class:`~astream._dataset.config.DatasetConfig`; the :class:`~astream._dataset.run.RunState`
(epoch, resume point, run-wide values); the per-process
:class:`~astream._dataset.session.NodeSession` (node clients, open shards, plans kept); the
:class:`~astream._dataset.planner.Planner` (its epoch plans and first batches); and, once a
loader is made, the :class:`~astream._dataset.start.prelude.Prelude` (the start-up). The
dataset pickles into spawned workers as configuration, indexes and run state; each process
makes its own session and planner, and a copy has no prelude.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import sys
import weakref
from collections.abc import AsyncIterator, Callable, Iterator, Mapping, Sequence
from contextlib import asynccontextmanager
from typing import Any

from astream._cache.index_file import load_index
from astream._cache.installer import check_hashes_present
from astream._cache.origin import claim_folder
from astream._cache.parquet_index import load_parquet_index
from astream._cache.wds_index import load_wds_index
from astream._coord.client import AsyncNodeClient
from astream._coord.config import CoordConfig
from astream._coord.world import World
from astream._dataset.access import RandomAccess
from astream._dataset.bridge import SyncIterator
from astream._dataset.cache_fit import check_dataset_cache, check_dataset_floor
from astream._dataset.config import DatasetConfig
from astream._dataset.iteration import ManagedAsyncIterator
from astream._dataset.layout import SampleMap
from astream._dataset.mixture import mixture_report
from astream._dataset.observe.stats import Stats
from astream._dataset.planner import Planner, ReaderShape
from astream._dataset.quarantine import Quarantine
from astream._dataset.quarantine_file import read_quarantine
from astream._dataset.read.reader import EpochReader
from astream._dataset.run import RunState
from astream._dataset.runtime import portal
from astream._dataset.session import NodeSession, main_member
from astream._dataset.start.prelude import Prelude
from astream._dataset.start.preopen import preopen
from astream._dataset.stream import Stream
from astream._dataset.torch_idiom import check_len_caller, check_torch_iteration, register_with_torch
from astream._format.index import Index
from astream._sampling.plan import EpochPlan
from astream._storage.registry import StoragePool, configure

__all__ = ["StreamingDataset"]


class StreamingDataset(RandomAccess):
    """A dataset streamed from remote or local MDS shards, in MosaicML Streaming's order.

    Parameters keep MosaicML Streaming's names and defaults. Give either ``streams`` or
    ``remote``/``local``/``split`` for a single stream. Each parameter is also readable
    as an attribute (``ds.shuffle``, ``ds.batch_size``, ...), as validated.

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
        transform: applied to every sample (``ds[i]``, iteration, ``get_batch``; in the
            worker with loader workers). A subclass may override ``__getitem__`` or
            ``get_item`` instead, as with MosaicML; iteration honours both.
        storage_options: settings of the remote's backend (endpoint, credentials, headers...),
            for ``remote=`` and for the streams that give none; see :class:`Stream`.
        format: ``"mds"``, ``"parquet"`` or ``"webdataset"`` for ``remote=`` (see :class:`Stream`).
        columns: the Parquet columns to read (default all).
        stream_name: MosaicML's name of a registered ``Stream`` class; only its default,
            ``"stream"``, is taken (astream has no registry: see docs/migration.md).
        stream_config: more keywords of the stream made from ``remote``/``local``: its
            weight (``proportion``, ``repeat`` or ``choose``), as in MosaicML.
        on_mixture_change: what ``load_state_dict`` does with a state saved under other
            streams, weights or ``epoch_size``: ``"raise"`` (a :class:`StateError`) or
            ``"continue"``: the rest of the epoch follows this mixture, never repeating what
            the epoch delivered (docs/guide/mixture-changes.md).
        on_bad_sample: ``"raise"`` (default): a sample that does not decode, a shard whose
            hash fails after a fresh download, or a transform's error stops the iteration.
            ``"skip"``: a :class:`Loader` replaces each bad sample inside its own batch by a
            repeat of a good one, the same way on every rank, rerun and resume, records it
            in its state dict and ``stats()``, and logs it once (docs/guide/bad-samples.md).
        max_bad_samples: with ``"skip"``, how many bad samples a rank may meet per epoch: a
            count (default 1000) or a fraction of the rank's epoch (a float below 1); one
            more raises :class:`~astream.errors.BadDataError`.
        skip_exceptions: with ``"skip"``, the exception types of the transform (or a
            subclass's ``__getitem__``) that make a sample bad; others still stop.
        quarantine: with ``"skip"``, samples known to be bad, never read: the path of a
            file ``astream verify DATASET --report --quarantine FILE`` wrote (applied to the
            streams it fits), or global sample ids.

    Raises:
        ConfigError: a bad parameter (before anything is downloaded).
        IndexFormatError, DownloadError: an index could not be fetched or parsed.
    """

    def __init__(
        self, *, streams: Sequence[Stream] | None = None, remote: str | None = None, local: str | None = None,
        split: str | None = None, download_retry: int = 2, download_timeout: float = 60.0,
        validate_hash: str | None = None, keep_zip: bool = False, epoch_size: int | str | None = None,
        predownload: int | None = None, cache_limit: int | str | None = None, sampling_method: str = "balanced",
        sampling_granularity: int = 1, partition_algo: str = "relaxed", num_canonical_nodes: int | None = None,
        batch_size: int | None = None, shuffle: bool = False, shuffle_algo: str = "py1e",
        shuffle_seed: int = 9176, shuffle_block_size: int | None = None, batching_method: str = "random",
        allow_unsafe_types: bool = False, replication: int | None = None, max_concurrency: int = 8,
        world: World | None = None, run_id: str | None = None, coord: CoordConfig | None = None,
        transform: Callable[[Any], Any] | None = None,
        storage_options: Mapping[str, Any] | None = None, format: str | None = None,
        columns: Sequence[str] | None = None, stream_name: str = "stream",
        stream_config: Mapping[str, Any] | None = None, on_mixture_change: str = "raise",
        on_bad_sample: str = "raise", max_bad_samples: int | float | None = None,
        skip_exceptions: Sequence[type[BaseException]] | None = None, quarantine: Quarantine = None,
    ) -> None:
        self.config = DatasetConfig.build(**{k: v for k, v in locals().items() if k != "self"})
        self.indexes: list[Index] = portal().call(_load_indexes(self.config.streams, self.config.cache_limit is None))
        check_dataset_floor(self.config, self.indexes)  # (before the node agent could refuse it)
        self.sample_map = SampleMap(self.indexes, self.config.allow_unsafe_types)
        if self.config.quarantine is not None:  # (its ids need the indexes)
            listed = read_quarantine(self.config.quarantine, self.indexes, self.sample_map)
            self.config = dataclasses.replace(self.config, bad_samples=self.config.bad_samples.with_listed(listed))
        self.run = RunState(self.config, self.config.fingerprint(self.indexes), self.config.mixture(self.indexes))
        self.session = NodeSession(self.config, self.indexes, self.sample_map, network_peek=True)
        self._planner = Planner(self.config, self.run, self.sample_map, self.session)
        weights = self.plan(epoch=0, sample_in_epoch=0, workers_per_rank=1).weights  # (validates the config)
        self._weights = tuple(zip(weights.proportion.tolist(), weights.repeat.tolist(), weights.choose.tolist(),
                                  strict=True))
        for stream, resolved in zip(streams or (), self._weights, strict=bool(streams)):
            stream.resolve(*resolved)  # as MosaicML writes them back into the streams it was given
        self._prelude: Prelude | None = None
        register_with_torch(StreamingDataset)  # (torch's DataLoader must iterate it: see torch_idiom.py)

    def prelude(self, shape: ReaderShape) -> Prelude | None:
        """The start-up prelude (:mod:`astream._dataset.start.prelude`), started by a :class:`Loader`
        when it is made, with its readers' ``shape`` (the first batches depend on it): the node
        joined and the first batches fetched while the program goes on.

        None for a bounded cache, whose readers' plans decide what it holds and whose size is
        checked when an epoch is set up, before any download; for datasets with nothing to
        download; with a quarantine (its lost shards are never fetched).
        """
        cfg = self.config
        if cfg.cache_limit is not None or all(s.remote is None for s in cfg.streams) or cfg.bad_samples.listed:
            return None
        prelude = self.__dict__.get("_prelude")
        if prelude is None:
            # Nothing in it refers to the dataset, which its finalizer must not keep alive.
            smap, session, shards = self.sample_map, self.session, self.session.shards
            prelude = self._prelude = Prelude(
                portal(), functools.partial(self.session.new_client, role="warm"), self._planner, self.run, smap,
                shards, lambda keys: preopen(keys, smap, session.sources, shards),
                per_sample=self._steps() is not None or cfg.bad_samples.skips)  # (skip: every batch through the reader's stand-ins)
            self.run.watch = prelude  # (it reacts to a loaded state's position)
            weakref.finalize(self, prelude.stop_soon).atexit = False  # (at exit the loop thread's close ends it)
        prelude.start(shape)
        return prelude

    def __getattr__(self, name: str) -> Any:
        # The validated parameters read as attributes (``ds.shuffle_seed``), as in MosaicML.
        config = self.__dict__.get("config")
        if config is not None and name in DatasetConfig.__dataclass_fields__:
            return getattr(config, name)
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    def __getstate__(self) -> dict[str, Any]:
        # Configuration, indexes and run state travel; the session and sample map are rebuilt,
        # and a copy has no prelude (its iteration asks for its own shards).
        return {k: v for k, v in self.__dict__.items() if k not in ("session", "sample_map", "_planner", "_prelude")}

    def __setstate__(self, state: dict[str, Any]) -> None:
        self.__dict__.update(state)
        self._prelude = None
        self.sample_map = SampleMap(self.indexes, self.config.allow_unsafe_types)
        # A loader's worker process reads ahead from local-directory remotes only.
        self.session = NodeSession(self.config, self.indexes, self.sample_map, network_peek=False)
        self._planner = Planner(self.config, self.run, self.sample_map, self.session)

    @property
    def streams(self) -> list[Stream]:
        """The streams with the dataset's settings filled in and their weights resolved."""
        return [s.resolved(*w) for s, w in zip(self.config.streams, self._weights, strict=True)]

    @property
    def columns(self) -> dict[str, str]:
        """Column name -> encoding, of the first stream's first shard."""
        return self.sample_map.columns

    @property
    def current_epoch(self) -> int:
        """The epoch this process iterates (or last iterated, or a loaded state resumes)."""
        return self.run.current_epoch

    def __len__(self) -> int:
        """This rank's samples per epoch: ``ceil(epoch_size / ranks)``, as MosaicML reports it."""
        check_len_caller(self, sys._getframe(1))
        return self.plan(epoch=self.run.epoch, sample_in_epoch=0, workers_per_rank=1).rank_len

    def plan(self, *, epoch: int, sample_in_epoch: int, workers_per_rank: int, batch_size: int | None = None) -> EpochPlan:
        """The epoch plan for this dataset, world and run state (``batch_size``: a loader's, used
        only when the dataset has none)."""
        return self._planner.plan(epoch=epoch, sample_in_epoch=sample_in_epoch, workers_per_rank=workers_per_rank,
                                  batch_size=batch_size)

    async def node(self, worker: int = 0, workers_per_rank: int = 1, *, role: str = "main") -> AsyncNodeClient:
        """This process's node client for the running loop (``role="worker"``: a loader worker's)."""
        return await self.session.node(worker, workers_per_rank, role=role)

    async def astats(self) -> Stats:
        """The node's cache figures now (see :class:`astream.Stats`)."""
        return Stats.of(await (await self.node()).stats(), mixture=self.mixture_report())

    def mixture_report(self) -> dict[str, Any]:
        """The change of mixture this epoch goes on under (``Stats.mixture``), or ``{}``."""
        run = self.run
        if run.history is None:
            return {}
        start = run.history.mixtures[-1].start
        plan = self.plan(epoch=run.history_epoch, sample_in_epoch=start, workers_per_rank=1)
        return mixture_report(run.history, plan, run.history_epoch)

    def stats(self) -> Stats:
        return portal().call(self.astats())

    async def aclose(self) -> None:
        """Leave the node (for this event loop, and the start-up prelude's); idempotent."""
        prelude = self.__dict__.get("_prelude")
        if prelude is not None:
            await prelude.astop_anywhere()
        await self.session.aclose()

    def close(self) -> None:
        """Leave the node from sync code and close open shards; idempotent."""
        portal().call(self.aclose())
        self.session.shards.close()

    async def begin_epoch(self, node: AsyncNodeClient, readers_per_rank: int = 1) -> tuple[int, int]:
        """Start an iteration: agree on the epoch with the node's ranks; return (epoch, offset). A
        loaded state resumes at its sample (also after iterating, which MosaicML ignores)."""
        prelude = self.__dict__.get("_prelude")
        if prelude is not None:
            await prelude.hand_over(node)  # the iteration asks for its shards itself now
        resume = self.run.fix_run_values()
        assert self.run.ncn is not None
        # A cache_limit too small for the node's readers fails here, before any download.
        check_dataset_cache(self.config, self.indexes, readers_per_rank=readers_per_rank,
                            num_canonical_nodes=self.run.ncn, warn=self.run.first_cache_check())
        world = self.config.unique_world
        first = world.node * world.ranks_per_node
        epoch = await node.begin_epoch([main_member(r) for r in range(first, first + world.ranks_per_node)],
                                       resume_epoch=None if resume is None else resume.epoch)
        return self.run.started(epoch, resume)

    def state_dict(self, num_samples: int, from_beginning: bool) -> dict[str, Any]:
        """The resumable state after ``num_samples`` samples (all ranks) of the current epoch;
        ``from_beginning`` counts from the epoch's start (Composer), not from the resume point."""
        return self.run.state_dict(num_samples, from_beginning)

    def load_state_dict(self, obj: Any) -> None:
        """Resume from a state (astream's or MosaicML's) at the next iteration; :class:`StateError`
        if it does not fit this dataset or world. It sets the position and nothing else (the
        start-up prelude, if any, reacts: :mod:`astream._dataset.start.prelude`)."""
        self.run.load(obj, self._planner.plan_at)

    @asynccontextmanager
    async def open_epoch_reader(
        self, epoch: int, offset: int, *, worker: int, workers_per_rank: int, batch_size: int | None,
        drop_last: bool = False, batch_transform: Callable[[Any], Any] | None = None,
        skipped: frozenset[int] = frozenset(), joined: bool = True,
    ) -> AsyncIterator[EpochReader]:
        """A reader of one worker's batches of an epoch that starts ``offset`` samples in
        (``skipped``: with ``on_bad_sample="skip"``, the ids known to be bad; ``joined=False``:
        on the loop's client as it is, which joins the node at its first call: the start-up
        prelude's batch 0 is read before that)."""
        plan = self.plan(epoch=epoch, sample_in_epoch=offset, workers_per_rank=workers_per_rank,
                         batch_size=batch_size)
        order = self._planner.worker_order(plan, worker, drop_last)
        node = (await self.node(worker, workers_per_rank, role="worker") if joined
                else self.session.client(worker, workers_per_rank, role="worker"))
        async with self.session.reader(node, order, self.config.resolved_predownload(batch_size), self._steps(),
                                       batch_transform, window=batch_size or self.config.batch_size or 1,
                                       skipped=skipped) as reader:
            yield reader

    @asynccontextmanager
    async def _sample_stream(self, chunked: bool) -> AsyncIterator[AsyncIterator[Any]]:
        epoch, offset = await self.begin_epoch(await self.node())
        async with self.open_epoch_reader(epoch, offset, worker=0, workers_per_rank=1,
                                          batch_size=self.config.batch_size) as reader:
            yield reader.chunks() if chunked else reader.samples()

    def __aiter__(self) -> ManagedAsyncIterator[dict[str, Any]]:
        """``async for sample in ds``: this rank's samples of the next epoch."""
        return ManagedAsyncIterator(self._sample_stream(chunked=False))

    def __iter__(self) -> Iterator[dict[str, Any]]:
        """``for sample in ds``: this rank's samples of the next epoch."""
        check_torch_iteration(self, sys._getframe(1))
        return self._samples()

    def _samples(self) -> Iterator[dict[str, Any]]:
        chunks = SyncIterator(portal(), lambda: self._sample_stream(chunked=True), maxsize=4)
        try:
            for chunk in chunks:
                yield from chunk
        finally:
            chunks.close()

    def __repr__(self) -> str:
        where = ", ".join(s.remote or s.local_dir for s in self.config.streams)
        return f"<StreamingDataset {where}: {self.size} samples, {len(self.config.streams)} stream(s)>"


async def _load_indexes(streams: Sequence[Stream], unbounded: bool) -> list[Index]:
    async def one(s: Stream) -> Index:
        # Whose cache the folder is, before anything of the remote comes into it (issue 31 item 1).
        if s.remote is not None:  # (a dataset read in place is nobody's cache)
            claim = functools.partial(claim_folder, s.local_dir, s.remote, s.split, default=s.local is None)
            await asyncio.get_running_loop().run_in_executor(None, claim)
        index = await load(s)
        if s.validate_hash:  # refused here, at construction, not later inside the node agent
            check_hashes_present(index, s.validate_hash)
        return index

    async def load(s: Stream) -> Index:
        if s.format != "mds":
            assert s.remote is not None  # such a stream always reads its files from somewhere
            async with StoragePool(configure(s.remote, s.remote_config)) as pool:
                if s.format == "webdataset":
                    return await load_wds_index(s.local_dir, s.remote, s.split, pool, keep_scans=unbounded)
                return await load_parquet_index(s.local_dir, s.remote, s.split, s.columns, pool)
        if s.remote is None or not s.remote_config:
            return await load_index(s.local_dir, s.remote, s.split)
        async with StoragePool(configure(s.remote, s.remote_config)) as pool:  # the stream's storage_options
            return await load_index(s.local_dir, s.remote, s.split, pool=pool)

    return list(await asyncio.gather(*(one(s) for s in streams)))

