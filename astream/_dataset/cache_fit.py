"""A dataset's ``cache_limit`` checked against the node's rules (:mod:`astream._node.room`).

The rules are the node's; this module only reads them the dataset's configuration: at
construction the floor of two shards, at each epoch's start one batch of every reader of
the node (and, once per run, the warning of a shuffle much wider than the cache).
"""

from __future__ import annotations

from collections.abc import Sequence

from astream._dataset.config import DatasetConfig
from astream._format.index import Index
from astream._node.room import check_cache_floor, check_cache_room, warn_if_thrashing
from astream._sampling.defaults import resolve_shuffle_block_size

__all__ = ["check_dataset_cache", "check_dataset_floor"]


def check_dataset_floor(config: DatasetConfig, indexes: Sequence[Index]) -> None:
    """:func:`~astream._node.room.check_cache_floor` for a dataset being made."""
    if config.cache_limit is None:
        return
    check_cache_floor(indexes, config.provider(indexes).streams, config.cache_limit)


def check_dataset_cache(config: DatasetConfig, indexes: Sequence[Index], *, readers_per_rank: int,
                        num_canonical_nodes: int, warn: bool) -> None:
    """:func:`check_cache_room` and (when ``warn``) :func:`warn_if_thrashing` for a dataset
    about to begin an epoch."""
    if config.cache_limit is None:
        return
    factory = config.provider(indexes)
    world = config.unique_world
    check_cache_room(indexes, factory.streams, readers=world.ranks_per_node * max(1, readers_per_rank),
                     batch_size=config.batch_size or 1)
    if warn:
        block = resolve_shuffle_block_size(config.shuffle_block_size, num_canonical_nodes)
        warn_if_thrashing(indexes, factory.streams, shuffle=config.shuffle, shuffle_algo=config.shuffle_algo,
                          block_size=block, blocks_at_once=max(1, num_canonical_nodes // max(1, world.num_nodes)))
