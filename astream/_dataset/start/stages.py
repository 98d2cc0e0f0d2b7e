"""The start-up prelude's state, as one explicit machine (pure: no loop, no client, no thread).

:class:`~astream._dataset.start.prelude.Prelude` is the I/O shell around a :class:`StartBook`:
it asks the book what to do, then does it on astream's loop thread. The book replaces the
warm start's seven flags (stopped, redirected, overtaken, the resume keys, the keys handed
over, the hold count and its gate) by one :class:`Stage` and the few values each stage needs.

The stages and their transitions (each a method of the book)::

    IDLE --start--> WARMING --move--> RESUMING
      |               |                  |  (move again: RESUMING, the new position's keys)
      |               +--hand_over--+----+
      |                             v
      |                          HANDED  (move: stays HANDED; its keys are still prefetched)
      +------------- stop ---------> STOPPED  (from any stage; final)

- ``WARMING``: joining the node in the background; once joined it asks which epoch the node
  begins and prefetches that epoch's first batches (:meth:`StartBook.may_plan`).
- ``RESUMING``: a loaded state moved the position (``load_state_dict``); its first batches
  are prefetched instead and the start asks nothing more of its own.
- ``HANDED``: an iteration has joined; it asks for its own shards, and the prelude plans
  nothing more. A loaded position's shards not yet asked for are handed to it once.
- ``STOPPED``: the dataset closed (or was collected): its client leaves the node.

Holds are counted beside the stage (:meth:`StartBook.hold`, :meth:`StartBook.release`): while
one is held, a start that has not joined the node yet waits (the shell bounds the wait).
"""

from __future__ import annotations

import enum
from dataclasses import dataclass, field

__all__ = ["Prefetch", "Stage", "StartBook"]


class Stage(enum.Enum):
    """Where the start-up prelude is (see the module's docstring)."""

    IDLE = "idle"
    WARMING = "warming"
    RESUMING = "resuming"
    HANDED = "handed"
    STOPPED = "stopped"


@dataclass(frozen=True)
class Prefetch:
    """What the prelude's client sends: shards to withdraw, then shards to prefetch (``first``)."""

    withdraw: list[str]
    ask: list[str]


@dataclass
class StartBook:
    """The prelude's stage and what it asked for (see the module's docstring).

    Attributes:
        stage: where it is.
        prefetched: the shards its client prefetched last (withdrawn when it moves elsewhere).
        resume: a loaded position's first shards (None: no state was loaded).
        handed: the shards the iteration asked for on its own client (None: none yet).
        holds: holds not released yet.
    """

    stage: Stage = Stage.IDLE
    prefetched: list[str] = field(default_factory=list)
    resume: list[str] | None = None
    handed: list[str] | None = None
    holds: int = 0

    def start(self) -> bool:
        """IDLE -> WARMING: True if the background start is to begin now (once)."""
        if self.stage is not Stage.IDLE:
            return False
        self.stage = Stage.WARMING
        return True

    def may_plan(self) -> bool:
        """Whether the start may ask for the node's epoch and prefetch its first batches: only
        while WARMING (a loaded position, an iteration or a stop overtook it otherwise)."""
        return self.stage is Stage.WARMING

    def may_run(self, planned: bool) -> bool:
        """Whether a queued step still runs: the start's own (``planned``) while WARMING, a
        loaded position's prefetch until STOPPED."""
        return self.may_plan() if planned else self.stage is not Stage.STOPPED

    def move(self, keys: list[str]) -> None:
        """A loaded state moved the position to where ``keys`` are read first: WARMING or
        RESUMING -> RESUMING (HANDED stays: the next iteration asks for its own)."""
        if self.stage is Stage.STOPPED:
            return
        self.resume = list(keys)
        if self.stage is not Stage.HANDED:
            self.stage = Stage.RESUMING

    def prefetch(self, keys: list[str], *, planned: bool) -> Prefetch | None:
        """The client's next prefetch, of ``keys`` (``planned``: the start's own, of the node's
        next epoch), or None if it may not run any more; what it prefetched before and
        ``keys`` lack is withdrawn, and nothing is asked that the iteration asked for itself."""
        if not self.may_run(planned):
            return None
        withdraw = sorted(set(self.prefetched) - set(keys))
        self.prefetched = list(keys)
        return Prefetch(withdraw, [] if keys == self.handed else list(keys))

    def hand_over(self) -> list[str] | None:
        """An iteration joined: -> HANDED. Returns the loaded position's shards for the
        iteration's client to ask for (once; None: nothing to hand over)."""
        if self.stage is Stage.STOPPED:
            return None
        self.stage = Stage.HANDED
        if self.resume is None or self.handed is not None:
            return None
        self.handed = self.resume
        return self.handed

    def stop(self) -> bool:
        """Any stage -> STOPPED: True if it was not stopped already."""
        stopping = self.stage is not Stage.STOPPED
        self.stage = Stage.STOPPED
        return stopping

    def hold(self) -> bool:
        """One more hold: True if it is the first (a start not joined yet must now wait)."""
        self.holds += 1
        return self.holds == 1

    def release(self) -> bool:
        """One hold less: True if it was the last (a waiting start may join now)."""
        if self.holds <= 0:
            raise RuntimeError("a prelude's hold released more often than taken")
        self.holds -= 1
        return self.holds == 0
