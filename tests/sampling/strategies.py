"""Hypothesis strategies for sampling configurations."""

from __future__ import annotations

from hypothesis import strategies as st

SHARD_AWARE = ("py1b", "py1br", "py1e", "py1s", "py2s")


def shard_sizes(min_total: int = 1, max_shards: int = 12, max_size: int = 60) -> st.SearchStrategy[list[int]]:
    """Shard sizes, empty shards included, with at least ``min_total`` samples in all."""
    return st.lists(st.integers(0, max_size), min_size=1, max_size=max_shards).filter(
        lambda sizes: sum(sizes) >= min_total
    )


seeds = st.integers(0, 2**32)
epochs = st.integers(0, 6)
block_sizes = st.sampled_from([2, 3, 10, 64, 1 << 18])
canonical_nodes = st.sampled_from([1, 2, 3, 4, 6, 8])
