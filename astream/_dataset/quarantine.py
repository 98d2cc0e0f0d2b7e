"""``on_bad_sample=``: what counts as a bad sample, the budget, and the record of those met.

Pure bookkeeping, no I/O: the reader asks :meth:`BadSamplePolicy.reason` whether an
error it caught is a bad sample (and of which kind), stands a substitute in for it
(:mod:`astream._sampling.substitute` has the rule) and hands the batch on as a
:class:`Substituted`, which carries the :class:`BadSample` records with it, across a
worker process's pipe too. The consumer's :class:`QuarantineBook` takes the records of
each batch it hands out (so what it records is exactly what the training loop got),
counts them against the budget, and puts the ids in the state dict: a resumed run and
later epochs substitute them without reading them again.

Nothing here is read per batch when nothing is bad: a batch that needed no substitute is
handed on as it is.
"""

from __future__ import annotations

import dataclasses
import math
import os
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from astream.errors import (
    AstreamError,
    BadDataError,
    ConfigError,
    FormatError,
    HashMismatchError,
    IndexFormatError,
    ServedSamplesError,
    SizeMismatchError,
    StateError,
    TransformError,
    UnsafeTypeError,
)

__all__ = [
    "DEFAULT_MAX_BAD",
    "MODES",
    "QUARANTINE_KEY",
    "RAISE",
    "BadSample",
    "BadSamplePolicy",
    "Quarantine",
    "QuarantineBook",
    "Substituted",
    "epoch_skips",
    "handed",
    "load_quarantine",
    "with_quarantine",
]

MODES = ("raise", "skip")
DEFAULT_MAX_BAD = 1000  # a count: the state's list stays small whatever the epoch's size
QUARANTINE_KEY = "astream_quarantine"
LISTED = 10  # bad samples a BadDataError names
# ``quarantine=``: a quarantine file (astream._dataset.quarantine_file), or global sample ids.
Quarantine = str | os.PathLike[str] | Iterable[int] | None


@dataclass(frozen=True)
class BadSample:
    """One bad sample met: its global id, the shard file it lives in, why it is bad."""

    sample: int
    shard: str
    reason: str  # "decode", "hash", "size", "transform"; "known"/"state": met before, not read again
    cause: str

    def as_tuple(self) -> tuple[int, str, str, str]:
        return (self.sample, self.shard, self.reason, self.cause)

    def describe(self) -> str:
        return f"sample {self.sample} of {self.shard} ({self.reason}): {self.cause}"


@dataclass(frozen=True)
class Substituted:
    """A batch in which bad samples were replaced, with their records (worker to consumer)."""

    batch: Any
    bad: tuple[BadSample, ...]


@dataclass(frozen=True)
class BadSamplePolicy:
    """What to do with a bad sample; see :class:`~astream.StreamingDataset`'s parameters.

    Attributes:
        mode: ``"raise"`` (stop at the first, as always) or ``"skip"``.
        max_bad: the budget per rank and epoch: a count (int) or a fraction of the rank's
            epoch (float in ``(0, 1)``).
        skip_exceptions: exception types of the user's transform that make a sample bad.
        listed: ids known to be bad before the run (a quarantine file): never read.
    """

    mode: str = "raise"
    max_bad: int | float = DEFAULT_MAX_BAD
    skip_exceptions: tuple[type[BaseException], ...] = ()
    listed: frozenset[int] = frozenset()

    @classmethod
    def build(cls, on_bad_sample: str, max_bad_samples: int | float | None,
              skip_exceptions: Iterable[type[BaseException]] | None,
              quarantine: bool = False) -> BadSamplePolicy:
        """Validate the dataset's parameters (``quarantine``: whether one was given).

        Raises:
            ConfigError: an unknown mode, a budget that is not a count or a fraction, a
                listed type that is not an exception class, or a skip parameter given with
                ``on_bad_sample="raise"`` (it would be ignored).
        """
        if on_bad_sample not in MODES:
            raise ConfigError(f"on_bad_sample must be one of {', '.join(map(repr, MODES))}, got {on_bad_sample!r}")
        exceptions = tuple(skip_exceptions or ())
        for exc in exceptions:
            if not (isinstance(exc, type) and issubclass(exc, Exception)):
                raise ConfigError(f"skip_exceptions must list Exception subclasses, got {exc!r}")
        if on_bad_sample == "raise":
            given = [name for name, value in (("max_bad_samples", max_bad_samples), ("skip_exceptions", exceptions),
                                              ("quarantine", quarantine)) if value]
            if given:
                raise ConfigError(f"{', '.join(given)} apply only with on_bad_sample='skip'; "
                                  "pass on_bad_sample='skip' or leave them out")
            return cls()
        budget: int | float = DEFAULT_MAX_BAD if max_bad_samples is None else max_bad_samples
        if isinstance(budget, bool) or not isinstance(budget, (int, float)):
            raise ConfigError(f"max_bad_samples must be a count (int) or a fraction (float), got {budget!r}")
        if isinstance(budget, float) and not 0.0 < budget < 1.0:
            raise ConfigError(f"max_bad_samples as a fraction must be in (0, 1), got {budget!r}; "
                              "pass an int for a count")
        if isinstance(budget, int) and budget < 0:
            raise ConfigError(f"max_bad_samples must be at least 0, got {budget}")
        return cls("skip", budget, exceptions)

    def with_listed(self, ids: frozenset[int]) -> BadSamplePolicy:
        """The policy with a quarantine's ids (resolved once the dataset's indexes are read)."""
        return dataclasses.replace(self, listed=ids)

    @property
    def skips(self) -> bool:
        return self.mode == "skip"

    def budget(self, epoch_samples: int) -> int:
        """How many bad samples a rank may meet in an epoch of ``epoch_samples`` of its own."""
        if isinstance(self.max_bad, float):
            return math.floor(self.max_bad * epoch_samples)
        return self.max_bad

    def reason(self, exc: BaseException) -> str | None:
        """Why ``exc`` makes a sample bad (``"decode"``, ``"hash"``, ``"size"``, ``"transform"``), or None
        when it is not a bad sample (and so stops the iteration, as with ``"raise"``).

        Not bad samples: an index or an unsafe type (the dataset's configuration), samples
        that changed while served (start again), I/O that failed (the network, not the data).
        """
        if not self.skips:
            return None
        if isinstance(exc, ServedSamplesError):
            return None
        if isinstance(exc, HashMismatchError):
            return "hash"
        if isinstance(exc, SizeMismatchError):
            return "size"  # (a truncated shard file; other download failures are the network's)
        if isinstance(exc, FormatError) and not isinstance(exc, (IndexFormatError, UnsafeTypeError)):
            return "decode"
        # The user's own exception, as the transform raised it (an astream error is never one).
        cause = exc.__cause__ if isinstance(exc, TransformError) else None if isinstance(exc, AstreamError) else exc
        if self.skip_exceptions and isinstance(cause, self.skip_exceptions) and not isinstance(cause, AstreamError):
            return "transform"
        return None


RAISE = BadSamplePolicy()  # the default: a bad sample stops the iteration


class QuarantineBook:
    """The bad samples one consumer (a Loader on one rank) handed out, and its budget.

    Args:
        policy: the dataset's policy.
        rank: this rank (a state's count applies to the rank that saved it).
    """

    def __init__(self, policy: BadSamplePolicy, rank: int) -> None:
        self.policy = policy
        self.rank = rank
        self.resume_spent = 0  # a loaded state's count, for the epoch it resumes
        self.known: dict[int, BadSample] = {}  # every bad sample met, any epoch
        self.epoch: list[BadSample] = []  # met this epoch, in the order handed out
        self.spent = 0  # positions substituted this epoch on this rank (before a resume too)
        self.total = 0  # positions substituted, all epochs of this consumer
        self.budget = policy.budget(0) if isinstance(policy.max_bad, int) else 0

    @classmethod
    def of(cls, policy: BadSamplePolicy, rank: int) -> QuarantineBook | None:
        """A consumer's book, or None with ``on_bad_sample="raise"``."""
        return cls(policy, rank) if policy.skips else None

    def open_epoch(self, offset: int, epoch_samples: Callable[[], int]) -> frozenset[int]:
        """An epoch begins ``offset`` samples in (a resumed one keeps its state's count;
        ``epoch_samples``: the rank's, asked only for a fraction budget); returns the ids its
        readers substitute without reading."""
        spent, self.resume_spent = (self.resume_spent if offset else 0), 0
        self.begin_epoch(epoch_samples() if isinstance(self.policy.max_bad, float) else 0, spent)
        return self.skipped()

    def begin_epoch(self, epoch_samples: int, spent: int = 0) -> None:
        """A new epoch of ``epoch_samples`` on this rank (``spent``: met before a resume)."""
        self.epoch = []
        self.spent = spent
        self.budget = self.policy.budget(epoch_samples)

    def skipped(self) -> frozenset[int]:
        """The ids a reader substitutes without reading them."""
        return self.policy.listed | frozenset(self.known)

    def met(self, bad: Iterable[BadSample]) -> None:
        """Record the bad samples of a batch about to be handed out.

        Raises:
            BadDataError: the budget is spent; names the first bad samples of the epoch.
        """
        for record in bad:
            self.total += 1
            if record.reason == "listed":
                continue  # known before the run (a quarantine file): not a surprise, not in the budget
            self.known.setdefault(record.sample, record)
            self.epoch.append(record)
            self.spent += 1
            if self.spent > self.budget:
                first = self.epoch[:LISTED]
                raise BadDataError(
                    f"rank {self.rank} met {self.spent} bad samples this epoch, more than max_bad_samples="
                    f"{self.policy.max_bad} allows ({self.budget}); the first: "
                    + "; ".join(r.describe() for r in first)
                    + ". Repair or drop those shards (`astream verify DATASET --report` lists them all), "
                    "or raise max_bad_samples",
                    tuple(r.as_tuple() for r in first),
                )

    def state(self) -> dict[str, Any]:
        """What the state dict keeps: the ids met (sorted) and this rank's count this epoch."""
        return {"ids": sorted(self.known), "rank": self.rank, "spent": self.spent}

    def load(self, state: Mapping[str, Any] | None, shard_of: Callable[[int], str] = lambda i: "?") -> int:
        """Take a state's record; returns the count to resume this epoch's budget from (the
        state's own if this rank saved it, else 0: another rank's count is not ours).

        ``shard_of`` names a sample's shard file (the state keeps only ids).

        Raises:
            StateError: the record is not what :meth:`state` writes.
        """
        if state is None:
            return 0
        ids, rank, spent = state.get("ids"), state.get("rank"), state.get("spent")
        if (not isinstance(ids, list) or not all(isinstance(i, int) and i >= 0 for i in ids)
                or not isinstance(rank, int) or not isinstance(spent, int) or spent < 0):
            raise StateError(f"state dict key {QUARANTINE_KEY!r} must be what state_dict() wrote, got {state!r}")
        for i in ids:
            self.known.setdefault(i, BadSample(i, shard_of(i), "state", "recorded in the state dict"))
        self.resume_spent = spent if rank == self.rank else 0
        return self.resume_spent


def epoch_skips(book: QuarantineBook | None, offset: int, epoch_samples: Callable[[], int]) -> frozenset[int]:
    """:meth:`QuarantineBook.open_epoch`, or nothing to skip without a book."""
    return frozenset() if book is None else book.open_epoch(offset, epoch_samples)


def with_quarantine(state: dict[str, Any], book: QuarantineBook | None) -> dict[str, Any]:
    """A state dict with the book's record in it (as it is without a book)."""
    return state if book is None else {**state, QUARANTINE_KEY: book.state()}


def load_quarantine(book: QuarantineBook | None, state: Mapping[str, Any], shard_of: Callable[[int], str]) -> None:
    """Take a state dict's record into the book (nothing without a book)."""
    if book is not None:
        book.load(state.get(QUARANTINE_KEY), shard_of)


def handed(book: QuarantineBook | None, batch: Substituted) -> Any:
    """A batch with substitutes as the consumer hands it out: its records counted first
    (BadDataError once the budget is spent)."""
    assert book is not None  # (only a skipping reader makes them)
    book.met(batch.bad)
    return batch.batch
