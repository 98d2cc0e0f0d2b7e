"""Every recorded partition (orders/partition.npz), and every recorded error, is reproduced."""

from __future__ import annotations

import numpy as np
import pytest

from astream.errors import ConfigError
from astream.sampling import get_partitions

from .golden import manifest, orders_npz


def _configs() -> list[dict]:
    return manifest()["partition"]["configs"]  # type: ignore[no-any-return]


def _args(c: dict) -> tuple:
    return (c["algo"], c["num_samples"], c["ncn"], c["pn"], c["rpn"], c["wpr"], c["bs"],
            c["drop_first"], c["initial_physical_nodes"])


@pytest.mark.parametrize("algo", ["orig", "relaxed"])
def test_golden_partitions(algo: str) -> None:
    expected = orders_npz("partition.npz")
    configs = [c for c in _configs() if c["algo"] == algo and c["key"] is not None]
    assert configs
    mismatches = []
    for c in configs:
        got = get_partitions(*_args(c))
        want = expected[c["key"]]
        if got.dtype != np.int64 or got.shape != tuple(c["shape"]) or not np.array_equal(got, want):
            mismatches.append(c["id"])
    assert not mismatches, f"{len(mismatches)}/{len(configs)} {algo} partitions differ: {mismatches[:20]}"


def test_golden_partition_errors() -> None:
    configs = [c for c in _configs() if c["key"] is None]
    assert configs
    wrong = []
    for c in configs:
        with pytest.raises(ConfigError) as info:
            get_partitions(*_args(c))
        message = str(info.value)
        # The peer's wording differs; the condition and the parameter named must match.
        if "divisible" in c["error"]:
            ok = "num_canonical_nodes" in message and "num_physical_nodes" in message
        elif "Resuming further" in c["error"]:
            ok = "sample_in_epoch" in message
        else:
            ok = True
        if not ok:
            wrong.append((c["id"], message))
    assert not wrong, wrong
