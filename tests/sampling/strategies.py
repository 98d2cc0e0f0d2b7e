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


@st.composite
def stream_weights(draw: st.DrawFn, count: int) -> tuple[list[dict[str, float | int | None]], int | None]:
    """Weights for ``count`` streams, of one kind (proportion, repeat, choose or none), and an
    ``epoch_size`` where the kind takes one."""
    kind = draw(st.sampled_from(["proportion", "repeat", "choose", "none"]))
    if kind == "proportion":
        values = draw(st.lists(st.sampled_from([0.0, 0.1, 0.25, 0.5, 1.0, 2.0]), min_size=count, max_size=count)
                      .filter(lambda v: sum(v) > 0))
        return [{"proportion": v} for v in values], draw(st.one_of(st.none(), st.integers(10, 300)))
    if kind == "none":
        return [{} for _ in range(count)], draw(st.one_of(st.none(), st.integers(10, 300)))
    if kind == "repeat":
        values = draw(st.lists(st.sampled_from([0.0, 0.3, 0.5, 1.0, 1.5, 2.0]), min_size=count, max_size=count))
        return [{"repeat": v} for v in values], None
    values = draw(st.lists(st.integers(0, 120), min_size=count, max_size=count))
    return [{"choose": v} for v in values], None
