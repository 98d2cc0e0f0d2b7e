"""Every recorded shuffle (orders/shuffle.npz and shuffle_py1b.npz) is reproduced exactly."""

from __future__ import annotations

import hashlib

import numpy as np
import pytest

from astream.sampling import get_shuffle

from .golden import manifest, orders_json, orders_npz, shard_sizes


def _sha1_int64(a: np.ndarray) -> str:
    return hashlib.sha1(np.ascontiguousarray(a, "<i8").tobytes()).hexdigest()[:16]


def _configs(source: str) -> list[dict]:
    if source == "shuffle":
        return manifest()["shuffle"]["configs"]  # type: ignore[no-any-return]
    return orders_json("shuffle_py1b.json")["configs"]  # type: ignore[no-any-return]


def _algos(source: str) -> list[str]:
    return sorted({c["algo"] for c in _configs(source)})


@pytest.mark.parametrize(
    ("source", "algo"),
    [(s, a) for s in ("shuffle", "shuffle_py1b") for a in _algos(s)],
)
def test_golden_shuffles(source: str, algo: str) -> None:
    expected = orders_npz(f"{source}.npz")
    configs = [c for c in _configs(source) if c["algo"] == algo]
    assert configs
    mismatches = []
    for c in configs:
        assert c["key"] is not None, f"{c['id']}: shuffle errors are not expected in the fixtures"
        got = get_shuffle(algo, shard_sizes(c["layout"]), c["num_canonical_nodes"], c["seed"],
                          c["epoch"], c["block_size"])
        want = expected[c["key"]]
        if got.dtype != np.int64 or not np.array_equal(got, want) or _sha1_int64(got) != c["sha1_int64"]:
            mismatches.append(c["id"])
    assert not mismatches, f"{len(mismatches)}/{len(configs)} {algo} shuffles differ: {mismatches[:20]}"


def test_fixture_counts() -> None:
    """The fixture files hold what the manifest lists (a guard against a truncated checkout)."""
    assert len(orders_npz("shuffle.npz")) == len(manifest()["shuffle"]["configs"])
    assert len(orders_npz("shuffle_py1b.npz")) == len(_configs("shuffle_py1b"))
