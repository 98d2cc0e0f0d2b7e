"""Side by side with mosaicml-streaming on inputs beyond the fixtures (``-m peer``).

Skipped unless ``streaming`` is importable, e.g.::

    <peer venv>/bin/python -m pytest tests/sampling -m peer   # docs/bench/peer.md
"""

from __future__ import annotations

import random
from typing import Any

import numpy as np
import pytest

from astream.errors import ConfigError
from astream.sampling import EpochPlan, get_partitions, get_shuffle

from .peer_model import import_streaming, peer_work

pytestmark = [pytest.mark.peer, pytest.mark.filterwarnings("ignore")]


@pytest.fixture(scope="module")
def streaming() -> Any:
    try:
        return import_streaming()
    except ImportError:
        pytest.skip("mosaicml-streaming is not installed")


def _both(ours: Any, theirs: Any) -> tuple[Any, Any]:
    """Run both; an exception counts as a result (ours must then be a ConfigError)."""
    try:
        mine: Any = ours()
    except ConfigError as e:
        mine = e
    try:
        peer: Any = theirs()
    except Exception as e:  # the peer raises ValueError, ZeroDivisionError, numpy errors...
        peer = e
    return mine, peer


def _same(mine: Any, peer: Any) -> bool:
    if isinstance(mine, Exception) or isinstance(peer, Exception):
        return isinstance(mine, Exception) and isinstance(peer, Exception)
    return bool(mine.shape == peer.shape and np.array_equal(mine, peer))


@pytest.mark.parametrize("seed", range(4))
def test_shuffles_match_the_peer(streaming: Any, seed: int) -> None:
    from streaming.base.shuffle import get_shuffle as peer_shuffle

    rnd = random.Random(seed)
    differ = []
    for _ in range(150):
        sizes = [rnd.choice([0, 1, 2, 3, 5, 17, 40, 100, 333]) for _ in range(rnd.randint(1, 12))]
        sizes[0] += 1
        args = (rnd.choice(["naive", "py1br", "py1e", "py1s", "py2s"]), sizes, rnd.randint(1, 9),
                rnd.choice([0, 1, 9176, 2**31]), rnd.randint(0, 5), rnd.choice([2, 3, 7, 16, 300, 1 << 18]))
        mine, peer = _both(lambda a=args: get_shuffle(*a),
                           lambda a=args: peer_shuffle(a[0], np.array(a[1], np.int64), *a[2:]))
        if not _same(mine, peer):
            differ.append(args)
    assert not differ, differ[:5]


@pytest.mark.parametrize("seed", range(4))
def test_partitions_match_the_peer(streaming: Any, seed: int) -> None:
    from streaming.base.partition import get_partitions as peer_partitions

    rnd = random.Random(seed)
    differ = []
    for _ in range(400):
        n = rnd.choice([0, 1, 2, 3, 5, 7, 13, 64, 100, 257, 1000])
        args = (rnd.choice(["orig", "relaxed"]), n, rnd.choice([1, 2, 3, 4, 6, 8, 12]),
                rnd.choice([1, 2, 3, 4, 6, 8]), rnd.randint(1, 5), rnd.randint(1, 4), rnd.randint(1, 9),
                rnd.choice([0, 1, 5, n // 2, n, n + 3]), rnd.choice([None, 1, 2, 3, 4]))
        mine, peer = _both(lambda a=args: get_partitions(*a), lambda a=args: peer_partitions(*a))
        if not _same(mine, peer):
            differ.append(args)
    assert not differ, differ[:5]


def _random_config(rnd: random.Random) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    weighting = rnd.choice(["none", "proportion", "repeat", "choose", "absolute", "epoch_size"])
    streams = []
    for s in range(rnd.randint(1, 3)):
        stream: dict[str, Any] = {"shard_sizes": [rnd.choice([0, 1, 3, 8, 20, 50, 120]) for _ in range(rnd.randint(1, 8))]}
        stream["shard_sizes"][-1] += 11
        if weighting == "proportion":
            stream["proportion"] = rnd.choice([0.1, 0.25, 0.5, 1.0, 2.0])
        if weighting == "repeat" or (weighting == "absolute" and s % 2 == 0):
            stream["repeat"] = rnd.choice([0.3, 0.5, 1.0, 1.7, 2.0, 3.25])
        if weighting == "choose" or (weighting == "absolute" and s % 2 == 1):
            stream["choose"] = rnd.randint(1, 300)
        streams.append(stream)
    kw = {
        "shuffle": rnd.random() < 0.8,
        "shuffle_algo": rnd.choice(["naive", "py1br", "py1e", "py1s", "py2s"]),
        "shuffle_seed": rnd.choice([0, 7, 9176]),
        "num_canonical_nodes": rnd.choice([None, 1, 2, 4, 8]),
        "shuffle_block_size": rnd.choice([None, 16, 100, 1000]),
        "partition_algo": rnd.choice(["orig", "relaxed"]),
        "batch_size": rnd.randint(1, 8),
        "num_physical_nodes": rnd.choice([1, 1, 2, 4]),
        "ranks_per_node": rnd.randint(1, 3),
        "workers_per_rank": rnd.randint(1, 3),
        "epoch": rnd.randint(0, 3),
        "sampling_method": rnd.choice(["balanced", "fixed"]),
        "sampling_granularity": rnd.choice([1, 1, 3, 10]),
        "batching_method": rnd.choice(["random", "random", "stratified", "per_stream", "device_per_stream"]),
        "epoch_size": rnd.choice([None, 200, 777]) if weighting in ("proportion", "epoch_size") else None,
        "initial_physical_nodes": rnd.choice([None, None, 1, 2]),
        "sample_in_epoch": rnd.choice([0, 0, rnd.randint(0, 400)]),
    }
    return streams, kw


@pytest.mark.parametrize("seed", range(4))
def test_epoch_plans_match_generate_work(streaming: Any, seed: int) -> None:
    rnd = random.Random(seed)
    differ = []
    for _ in range(120):
        streams, kw = _random_config(rnd)
        resolved = dict(kw)
        try:
            plan = EpochPlan(streams, **kw)
            resolved.update(num_canonical_nodes=plan.num_canonical_nodes, shuffle_block_size=plan.shuffle_block_size)
        except ConfigError:
            continue  # invalid before any work: covered by the golden and error tests
        mine, peer = _both(plan.work, lambda s=streams, r=resolved: peer_work(s, **r))
        if not _same(mine, peer):
            differ.append((streams, kw))
        elif not isinstance(mine, Exception):
            differ += [
                (streams, kw, index)
                for index in np.ndindex(*mine.shape[:3])
                if not np.array_equal(plan.worker_ids(*index), mine[index].reshape(-1))
            ]
    assert not differ, differ[:3]
