"""Default values of the sampling knobs, resolved exactly as MosaicML Streaming does.

MosaicML fills ``num_canonical_nodes`` and ``shuffle_block_size`` lazily at the first
``__iter__`` (or ``state_dict``) from the node count of the parallel world; the functions
here are those rules as pure functions, so a plan made ahead of time agrees with a run.
"""

from __future__ import annotations

__all__ = [
    "BATCHING_METHODS",
    "DEFAULT_BATCHING_METHOD",
    "DEFAULT_PARTITION_ALGO",
    "DEFAULT_SAMPLING_GRANULARITY",
    "DEFAULT_SAMPLING_METHOD",
    "DEFAULT_SHUFFLE_ALGO",
    "DEFAULT_SHUFFLE_BLOCK_SIZE",
    "DEFAULT_SHUFFLE_SEED",
    "MAX_CANONICAL_NODES",
    "PARTITION_ALGOS",
    "SAMPLING_METHODS",
    "SHUFFLE_ALGOS",
    "lookahead",
    "resolve_num_canonical_nodes",
    "resolve_predownload",
    "resolve_shuffle_block_size",
]

SHUFFLE_ALGOS = ("naive", "py1b", "py1br", "py1e", "py1s", "py2s")
PARTITION_ALGOS = ("orig", "relaxed")
SAMPLING_METHODS = ("balanced", "fixed")
BATCHING_METHODS = ("random", "stratified", "per_stream", "device_per_stream")

DEFAULT_SHUFFLE_ALGO = "py1e"
DEFAULT_SHUFFLE_SEED = 9176
DEFAULT_SHUFFLE_BLOCK_SIZE = 1 << 18
DEFAULT_PARTITION_ALGO = "relaxed"
DEFAULT_SAMPLING_METHOD = "balanced"
DEFAULT_SAMPLING_GRANULARITY = 1
DEFAULT_BATCHING_METHOD = "random"

# The shuffles that work shard by shard want many canonical nodes so that a node's
# slice of the epoch still mixes many shards.
_SHARD_WISE_ALGOS = ("py1s", "py2s")


# The most canonical nodes a plan takes: 64 per node (py1s's default) for 16,384 nodes.
# A plan costs ~100 bytes and ~10 us per canonical node whatever the dataset (measured:
# 2**20 took 0.1 GB and 5-10 s on 2 busy cores), so a state or a parameter naming 10**9
# would take 100 GB before it failed.
MAX_CANONICAL_NODES = 1 << 20


def resolve_num_canonical_nodes(given: int | None, shuffle_algo: str, num_physical_nodes: int) -> int:
    """Return the canonical node count MosaicML would use.

    ``None`` and ``0`` both mean "not given" (MosaicML tests truthiness): 64 per physical
    node for ``py1s``/``py2s``, else one per physical node. The choice depends on
    ``shuffle_algo`` even when ``shuffle`` is off, as in MosaicML.
    """
    if given:
        return given
    if shuffle_algo in _SHARD_WISE_ALGOS:
        return 64 * num_physical_nodes
    return num_physical_nodes


def resolve_shuffle_block_size(given: int | None, num_canonical_nodes: int | None) -> int:
    """Return ``given``, else ``max(4_000_000 // num_canonical_nodes, 1 << 18)``.

    Only ``None`` means "not given" here (MosaicML tests ``is None``); with no canonical
    node count yet the default is ``1 << 18``.
    """
    if given is not None:
        return given
    if not num_canonical_nodes:
        return DEFAULT_SHUFFLE_BLOCK_SIZE
    return max(4_000_000 // num_canonical_nodes, DEFAULT_SHUFFLE_BLOCK_SIZE)


def resolve_predownload(given: int | None, batch_size: int | None) -> int:
    """Return ``given``, else ``8 * batch_size``, else 64 when there is no batch size."""
    if given is not None:
        return given
    return 8 * batch_size if batch_size is not None else 64


def lookahead(predownload: int, read_size: int) -> int:
    """Samples a reader keeps requested ahead of the consumer: at least what one read takes.

    A read (a batch, or a chunk of direct iteration) waits for all of its shards, so the
    look-ahead must cover it or the reader would wait for shards it has not asked for.
    """
    return max(1, predownload, read_size)
