"""The life of one shard in the cache, as a small state machine.

::

    ABSENT --begin_install--> BUSY --installed--> READY
       ^                        |                   |
       +------forget------------+----forget---------+
                               READY --begin_check--> BUSY --check_passed/abandoned--> READY

``verified`` says its files were checked against index.json's digest (or written by this
run); ``suspect`` that they may not have survived a power cut and must be checked before
use. Every change goes through a method here, which refuses one the state does not allow.
"""

from __future__ import annotations

import enum
from collections.abc import Iterator, Sequence
from dataclasses import dataclass
from typing import overload

from astream.errors import CacheError

__all__ = ["Entries", "Entry", "State"]


class State(enum.Enum):
    ABSENT = "absent"
    BUSY = "busy"  # being downloaded, decompressed or verified
    READY = "ready"


@dataclass
class Entry:
    """What the cache knows about one shard."""

    state: State = State.ABSENT
    size: int = 0  # bytes accounted (on disk, or reserved while BUSY)
    pins: int = 0
    last_used: int = 0
    verified: bool = False
    # Maybe not on disk when the power last went (written without fsync before the last
    # boot, or by a run whose background fsync may not have finished): check before use.
    suspect: bool = False

    def _require(self, state: State, transition: str) -> None:
        if self.state is not state:
            raise CacheError(f"shard cache bug: {transition} of a shard that is {self.state.value}, not {state.value}")

    def found(self, size: int, suspect: bool) -> None:
        """Its complete files were found on disk at start."""
        self._require(State.ABSENT, "found")
        self.state, self.size, self.suspect = State.READY, size, suspect

    def begin_install(self, size: int) -> None:
        """A transfer starts: ``size`` bytes are reserved for it."""
        self._require(State.ABSENT, "begin_install")
        self.state, self.size = State.BUSY, size

    def installed(self, size: int) -> None:
        """Its files are in place (``size`` bytes on disk), written and checked by this run."""
        self._require(State.BUSY, "installed")
        self.state, self.size, self.verified, self.suspect = State.READY, size, True, False

    def needs_check(self, validate: bool) -> bool:
        """Ready, but to be checked before use (suspect, or ``validate_hash`` and unchecked)."""
        return self.state is State.READY and (self.suspect or (validate and not self.verified))

    def begin_check(self) -> None:
        self._require(State.READY, "begin_check")
        self.state = State.BUSY

    def check_passed(self) -> None:
        self._require(State.BUSY, "check_passed")
        self.state, self.verified, self.suspect = State.READY, True, False

    def check_abandoned(self) -> None:
        """The check did not finish (or failed on the user's own files): ready as before."""
        self._require(State.BUSY, "check_abandoned")
        self.state = State.READY

    def forget(self) -> int:
        """Its files are gone (failed, or evicted); returns the bytes it held."""
        held = self.size
        self.state, self.size, self.verified, self.suspect = State.ABSENT, 0, False, False
        return held


class Entries(Sequence[Entry]):
    """Every shard's :class:`Entry`, made when the shard is first touched: at a million
    shards, those a node never fetched nor found hold nothing (an absent one reads as a
    fresh ``Entry()``, not kept)."""

    def __init__(self, count: int) -> None:
        self._count = count
        self._made: dict[int, Entry] = {}

    def __len__(self) -> int:
        return self._count

    @overload
    def __getitem__(self, i: int) -> Entry: ...
    @overload
    def __getitem__(self, i: slice) -> Sequence[Entry]: ...
    def __getitem__(self, i: int | slice) -> Entry | Sequence[Entry]:
        if isinstance(i, slice):
            return [self[k] for k in range(*i.indices(self._count))]
        if i < 0:
            i += self._count
        if not 0 <= i < self._count:
            raise IndexError(f"shard {i} of {self._count}")
        got = self._made.get(i)
        if got is None:
            got = self._made[i] = Entry()
        return got

    def __iter__(self) -> Iterator[Entry]:
        made = self._made
        return (made.get(i) or Entry() for i in range(self._count))

    def touched(self) -> list[tuple[int, Entry]]:
        """The shards that have an entry, in shard order (every one not absent is among them)."""
        return sorted(self._made.items())

    def all_ready(self) -> bool:
        return len(self._made) == self._count and all(e.state is State.READY for e in self._made.values())
