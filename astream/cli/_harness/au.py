"""Accelerator utilisation, MLPerf Storage style: how many simulated accelerators a loader
keeps busy.

An accelerator is a rank process of one node (the launcher's variables) with its own
shuffled loader, whose loop sleeps a fixed step time per batch (``work.mds.accelerate``).
Its utilisation (AU) is the time it computed over its wall time, from the moment every rank
has its first batch to its last step. A trial of N passes when every accelerator is at
AU >= 90 %; :func:`largest` finds the largest N that passes.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from astream.cli._harness.bench import Bench

__all__ = ["busy", "largest"]

TARGET = 0.9


def largest(passes: Callable[[int], bool], max_n: int) -> int:
    """The largest N <= ``max_n`` that ``passes``: N = 1, 2, 4, ... until one fails, then a
    bisection between the last pass and the first failure (0 when N = 1 fails)."""
    best, n, fail = 0, 1, None
    while n <= max_n:
        if not passes(n):
            fail = n
            break
        best, n = n, n * 2
    lo, hi = best, fail or best
    while fail is not None and hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (mid, hi) if passes(mid) else (lo, mid)
    return lo


def busy(bench: Bench, config: dict[str, Any], side: str, n: int, params: dict[str, Any],
         env: dict[str, str] | None = None) -> dict[str, Any]:
    """One trial: ``n`` accelerators of ``side`` (``params`` of ``accelerate`` but the barrier);
    the lowest AU, the p99 ``next()`` wait, the slowest first batch and the CPU per sample of
    the ranks' process trees, and whether it passed."""
    r = bench.once({**config, "n": n}, side, "mds", "accelerate", {**params, "barrier": "{run}"}, env, ranks=n)
    ranks = r["result"] if isinstance(r["result"], list) else [r["result"]]
    waits = sorted(w for x in ranks for w in x["waits"])
    au = min(x["compute_s"] / x["wall_s"] for x in ranks)
    samples = sum(x["samples"] for x in ranks)
    return {"n": n, "au_min": au, "passed": au >= TARGET,
            "p99_wait_ms": waits[int(0.99 * (len(waits) - 1))] * 1e3 if waits else 0.0,
            "first_batch_s": max(x["first_batch_s"] for x in ranks), "steps": ranks[0]["steps"],
            "cpu_us_per_sample": sum(x["cpu_s"] for x in ranks) / max(1, samples) * 1e6}
