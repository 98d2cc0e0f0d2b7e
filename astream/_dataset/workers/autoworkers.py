"""``num_workers="auto"``: the worker count from the machine's cores and the batches' cost.

No probe runs: the first epoch is read without workers (its first batch comes soonest
that way, and no process starts), and what it costs is noted as its batches are made
for the user: the CPU time the loader spent producing them (reading, decoding,
``transform``, collation, ``batch_transform``) per batch over the epoch, and the time
the consumer spent between its first :data:`OBSERVED` batches (its training step). From the next epoch on the
loader runs the count :func:`choose_workers` returns for those figures and the cores
this process may use (``os.sched_getaffinity``), shared with the other ranks of the
node. Nothing joins the node agent's epoch barrier but the rank itself (workers are
clients, never barrier members), so the choice changes no membership.

The rule, in full (``Loader.worker_choice`` shows its inputs and result):

- cores per rank = usable cores // ranks on the node; fewer than 2: no workers (a
  worker would take the core the consumer needs, and add the transport);
- a batch cheaper to produce than to carry across (:data:`CROSS_S` plus its bytes at
  :data:`CROSS_BYTES_PER_S`, the transport measured in ``docs/bench/transport.md``):
  no workers;
- otherwise as many as keep up with the consumer — ``ceil(produce / step)``, ``step``
  at least the crossing cost — at least 1, at most cores per rank - 1 (one core is the
  consumer's) and :data:`MAX_AUTO_WORKERS`.
"""

from __future__ import annotations

import math
import os
from dataclasses import dataclass

__all__ = ["CROSS_BYTES_PER_S", "CROSS_S", "MAX_AUTO_WORKERS", "OBSERVED", "WorkerChoice", "choose_workers",
           "usable_cores"]

OBSERVED = 16  # batches of the first epoch whose consumer step and size the choice uses
MAX_AUTO_WORKERS = 8
CROSS_S = 150e-6  # fixed cost of one batch crossing from a worker (framing, wake-ups)
CROSS_BYTES_PER_S = 2e9  # the slots' transport on a loaded 2-core machine


@dataclass(frozen=True)
class WorkerChoice:
    """What ``num_workers="auto"`` chose, and from what.

    Attributes:
        workers: the worker processes of the epochs after the first.
        cores: cores this process may use (``os.sched_getaffinity``).
        ranks_per_node: ranks sharing them.
        produce_s: median CPU seconds the loader spent producing one batch.
        step_s: median seconds the consumer spent between two batches.
        batch_bytes: bytes of a batch's arrays.
        reason: the rule that decided, in words.
    """

    workers: int
    cores: int
    ranks_per_node: int
    produce_s: float
    step_s: float
    batch_bytes: int
    reason: str


def usable_cores() -> int:
    """Cores this process may run on (its affinity mask; ``os.cpu_count()`` where there is none)."""
    try:
        return len(os.sched_getaffinity(0))
    except (AttributeError, OSError):  # pragma: no cover - macOS, Windows
        return os.cpu_count() or 1


def choose_workers(cores: int, ranks_per_node: int, produce_s: float, step_s: float, batch_bytes: int) -> WorkerChoice:
    """The worker count for a rank (see the module's docstring for the rule)."""
    per_rank = max(1, cores // max(1, ranks_per_node))
    cross = CROSS_S + batch_bytes / CROSS_BYTES_PER_S

    def made(workers: int, reason: str) -> WorkerChoice:
        return WorkerChoice(workers, cores, ranks_per_node, produce_s, step_s, batch_bytes, reason)

    if per_rank < 2:
        return made(0, f"{per_rank} core per rank: a worker would take the consumer's core")
    if produce_s <= cross:
        return made(0, f"a batch costs {produce_s * 1e3:.3f} ms to produce, less than the "
                       f"{cross * 1e3:.3f} ms it would take to cross from a worker")
    needed = math.ceil(produce_s / max(step_s, cross))
    limit = min(per_rank - 1, MAX_AUTO_WORKERS)
    workers = max(1, min(needed, limit))
    return made(workers, f"{needed} worker(s) keep up with a consumer step of {step_s * 1e3:.3f} ms at "
                         f"{produce_s * 1e3:.3f} ms per batch; {limit} at most ({per_rank} cores per rank, one "
                         "for the consumer)")
