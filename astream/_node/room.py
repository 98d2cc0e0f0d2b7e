"""Whether a ``cache_limit`` can hold what the node's readers need, checked before any download.

Readers of a bounded cache pin one batch each (the dataset layer's reader), so the
limit must hold every reader's batch at its largest shards at once, plus one shard for
random access (:func:`astream._cache.eviction.min_cache_bytes`); a smaller one is refused
at the start of an epoch, and one below two shards already when the dataset is made. A shuffle whose blocks in flight span far more than the limit
works, but mostly downloads shards again: that warns once.
"""

from __future__ import annotations

import warnings
from collections.abc import Sequence

from astream._cache.eviction import min_cache_bytes
from astream._format.columns import columns_of
from astream._format.index import Index
from astream._node.provider import EngineSpec
from astream.errors import CacheError, CacheWarning

__all__ = ["check_cache_floor", "check_cache_room", "footprints", "warn_if_thrashing"]


def footprints(index: Index, keep_zip: bool) -> list[int]:
    """Bytes each shard of ``index`` takes in the cache once installed."""
    return list(columns_of(index).footprints(keep_zip).tolist())


def check_cache_room(indexes: Sequence[Index], specs: Sequence[EngineSpec], *, readers: int, batch_size: int) -> None:
    """Refuse a ``cache_limit`` that cannot hold one batch of every reader of the node at once.

    Args:
        indexes: each stream's index.
        specs: each stream's engine settings (its share of ``cache_limit``).
        readers: processes reading on this node at once (ranks × loader workers).
        batch_size: samples each reads at once.

    Raises:
        CacheError: naming the limit, the minimum and where it comes from.
    """
    for stream, (index, spec) in enumerate(zip(indexes, specs, strict=True)):
        if spec.cache_limit is None or spec.remote is None:
            continue  # no limit, or the user's own files (never evicted)
        sizes = footprints(index, spec.keep_zip)
        need = min_cache_bytes(sizes, batch_size, readers)
        if spec.cache_limit < need:
            top = sorted(sizes, reverse=True)[: max(1, batch_size)]
            where = f"stream {stream} ({spec.remote}) gets {spec.cache_limit} bytes of it" if len(specs) > 1 else \
                f"cache_limit={spec.cache_limit} bytes"
            raise CacheError(
                f"{where}, but this node needs at least {need} bytes: {readers} reader(s) on the node "
                f"(ranks x loader workers) each hold one batch of {batch_size} samples, which can span "
                f"the {len(top)} largest shards ({sum(top)} bytes), plus one shard ({top[0]} bytes) for "
                "random access; raise cache_limit, or lower batch_size, num_workers or the shard size"
            )


def warn_if_thrashing(indexes: Sequence[Index], specs: Sequence[EngineSpec], *, shuffle: bool, shuffle_algo: str,
                      block_size: int, blocks_at_once: int) -> None:
    """Warn when the shuffle reads across far more bytes at once than the cache holds.

    A shuffle draws each of ``blocks_at_once`` (canonical nodes of this node) stretches of
    ``block_size`` samples in random order; while it is in one, everything in it is its
    working set. Much wider than the cache, most reads are re-downloads.
    """
    if not shuffle:
        return
    for stream, (index, spec) in enumerate(zip(indexes, specs, strict=True)):
        if spec.cache_limit is None or spec.remote is None or not index.shards:
            continue
        total = sum(footprints(index, spec.keep_zip))
        samples = max(1, int(columns_of(index).samples.sum()))
        if shuffle_algo == "naive":
            working = total
        else:
            working = min(total, blocks_at_once * block_size * total // samples)
        if working > 2 * spec.cache_limit:
            warnings.warn(
                f"stream {stream}: the {shuffle_algo} shuffle reads across about {working} bytes at once "
                f"({blocks_at_once} block(s) of {block_size} samples) but cache_limit gives it "
                f"{spec.cache_limit} bytes: most reads will download a shard again. Use a smaller "
                f"shuffle_block_size (about {max(1, block_size * spec.cache_limit // max(1, working))} would "
                f"fit) or a larger cache_limit (about {working} bytes)",
                CacheWarning, stacklevel=4,
            )


def check_cache_floor(indexes: Sequence[Index], specs: Sequence[EngineSpec], cache_limit: int | None) -> None:
    """Refuse, when the dataset is made, a ``cache_limit`` below what any use needs: two of a
    stream's largest shards (one in use, one arriving), the node agent's own floor.

    Args:
        indexes: each stream's index.
        specs: each stream's engine settings (its share of ``cache_limit``).
        cache_limit: the dataset's whole limit (None: unbounded).

    Raises:
        CacheError: naming the limit, the stream and the shard sizes.
    """
    if cache_limit is None:
        return
    for stream, (index, spec) in enumerate(zip(indexes, specs, strict=True)):
        if spec.cache_limit is None or spec.remote is None or not index.shards:
            continue
        largest = max(footprints(index, spec.keep_zip))
        need = min_cache_bytes([largest], 1, 1)
        if spec.cache_limit < need:
            where = (f"stream {stream} ({spec.remote}) gets {spec.cache_limit} bytes of cache_limit={cache_limit}"
                     if len(indexes) > 1 else f"cache_limit={spec.cache_limit} bytes")
            raise CacheError(
                f"{where}, but its largest shard takes {largest} bytes once cached"
                f"{' (with keep_zip)' if spec.keep_zip else ''}, and one shard in use plus one arriving need "
                f"{need}: raise cache_limit to at least {need} (more with several ranks, batches spanning "
                "several shards or loader workers) or write smaller shards"
            )
