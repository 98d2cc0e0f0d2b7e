"""Barrier bookkeeping of the node agent, sans I/O.

A barrier is named; its parties are either a count or the member names that must arrive
(``"rank3.worker1"``). It completes when every party has arrived; it fails

- when its deadline passes (:class:`~astream.errors.BarrierTimeout`), naming who is missing;
- at once when a party dies — its connection closes without a goodbye — naming the dead
  and the missing (``CoordinationError``).

The agent feeds arrivals, disconnections and clock ticks in and sends the answers out.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from astream.errors import BarrierTimeout, CoordinationError

__all__ = ["Arrival", "Barrier", "BarrierBook"]


@dataclass(frozen=True)
class Arrival:
    """One party waiting at a barrier: its connection, its member name, its request id."""

    conn: int
    member: str
    request: int


@dataclass
class Barrier:
    """An open barrier."""

    name: str
    parties: int | frozenset[str]
    deadline: float
    started: float
    arrivals: dict[str, Arrival] = field(default_factory=dict)

    @property
    def complete(self) -> bool:
        """Whether every party has arrived."""
        if isinstance(self.parties, int):
            return len(self.arrivals) >= self.parties
        return self.parties <= self.arrivals.keys()

    def missing(self) -> list[str]:
        """Names of the parties not arrived yet (a count sentence for a counted barrier)."""
        if isinstance(self.parties, int):
            return [f"{self.parties - len(self.arrivals)} of {self.parties} parties"]
        return sorted(self.parties - self.arrivals.keys())

    def describe(self, now: float) -> str:
        """A sentence for logs and errors."""
        return (
            f"barrier {self.name!r} waited {now - self.started:.1f}s: arrived {sorted(self.arrivals) or 'none'}, "
            f"missing {', '.join(self.missing())}"
        )


def _parties(value: int | list[str]) -> int | frozenset[str]:
    return value if isinstance(value, int) else frozenset(value)


class BarrierBook:
    """Every open barrier of the node, and which members died."""

    def __init__(self) -> None:
        self.open: dict[str, Barrier] = {}
        self.dead: dict[str, float] = {}

    def arrive(
        self, name: str, parties: int | list[str], timeout: float, arrival: Arrival, now: float
    ) -> tuple[Barrier, CoordinationError | None]:
        """Record ``arrival``. Returns the barrier and an error if it failed (then it is closed).

        The caller checks ``barrier.complete`` and closes it with :meth:`close` once answered.

        Raises:
            CoordinationError: this arrival is wrong (not a party, parties disagree, member
                already waiting); only that caller is told, the barrier stays open.
        """
        wanted = _parties(parties)
        barrier = self.open.get(name)
        if barrier is None:
            barrier = Barrier(name, wanted, now + timeout, now)
        elif barrier.parties != wanted:
            raise CoordinationError(
                f"barrier {name!r}: {arrival.member} expects parties {_show(wanted)}, "
                f"others arrived expecting {_show(barrier.parties)}"
            )
        if isinstance(wanted, frozenset) and arrival.member not in wanted:
            raise CoordinationError(f"barrier {name!r}: {arrival.member} is not one of its parties {_show(wanted)}")
        if arrival.member in barrier.arrivals:
            raise CoordinationError(f"barrier {name!r}: {arrival.member} is already waiting at it")
        self.open[name] = barrier
        barrier.arrivals[arrival.member] = arrival
        dead = self._dead_parties(barrier)
        if dead:
            return barrier, self._fail(barrier, dead, now)
        return barrier, None

    def close(self, barrier: Barrier) -> None:
        """Forget a barrier that was answered."""
        if self.open.get(barrier.name) is barrier:
            del self.open[barrier.name]

    def joined(self, member: str) -> None:
        """A member (re)connected: it is alive again."""
        self.dead.pop(member, None)

    def disconnected(self, member: str, *, clean: bool, now: float) -> list[tuple[Barrier, CoordinationError]]:
        """A member's connection closed; fail (and close) each barrier it was needed at.

        A clean goodbye removes a waiting member from its barriers without failing them.
        """
        if not clean:
            self.dead[member] = now
        failed = []
        for barrier in list(self.open.values()):
            if clean:
                barrier.arrivals.pop(member, None)
                if not barrier.arrivals:
                    self.close(barrier)
                continue
            waiting = barrier.arrivals.pop(member, None) is not None
            expected = isinstance(barrier.parties, frozenset) and member in barrier.parties
            if waiting or expected:
                failed.append((barrier, self._fail(barrier, [member], now)))
        return failed

    def expire(self, now: float) -> list[tuple[Barrier, CoordinationError]]:
        """Fail (and close) every barrier whose deadline has passed."""
        failed: list[tuple[Barrier, CoordinationError]] = []
        for barrier in list(self.open.values()):
            if barrier.deadline <= now:
                self.close(barrier)
                failed.append((barrier, BarrierTimeout(f"{barrier.describe(now)} (timed out)")))
        return failed

    def next_deadline(self) -> float | None:
        """The earliest deadline of an open barrier."""
        return min((b.deadline for b in self.open.values()), default=None)

    def _dead_parties(self, barrier: Barrier) -> list[str]:
        if isinstance(barrier.parties, int):
            return []
        return sorted(m for m in barrier.parties - barrier.arrivals.keys() if m in self.dead)

    def _fail(self, barrier: Barrier, dead: list[str], now: float) -> CoordinationError:
        self.close(barrier)
        return CoordinationError(
            f"{barrier.describe(now)}; cannot complete: {', '.join(dead)} died (connection closed without goodbye)"
        )


def _show(parties: int | frozenset[str]) -> str:
    return str(parties) if isinstance(parties, int) else "[" + ", ".join(sorted(parties)) + "]"
