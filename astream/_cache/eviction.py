"""The eviction choice, as a pure function: which shards to delete to make room.

Least recently used first, never a pinned shard (one being read, or reserved by a
prefetch) and never a shard that is not ours to delete (its only copy is local).
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass

__all__ = ["Candidate", "choose_victims"]


@dataclass(frozen=True)
class Candidate:
    """One resident shard as the eviction policy sees it."""

    key: int
    size: int
    last_used: int
    pinned: bool = False
    evictable: bool = True


def choose_victims(candidates: Iterable[Candidate], used: int, need: int, limit: int | None) -> list[int] | None:
    """Pick shards to evict so that ``used - freed + need <= limit``.

    Args:
        candidates: the resident shards.
        used: bytes the cache holds now (resident plus reserved).
        need: bytes about to be added.
        limit: the cache limit, or None for no limit.

    Returns:
        Keys to evict, least recently used first (empty if nothing needs to go), or None
        if even evicting every evictable shard would not make enough room.
    """
    if limit is None or used + need <= limit:
        return []
    excess = used + need - limit
    victims: list[int] = []
    for cand in sorted(candidates, key=lambda c: (c.last_used, c.key)):
        if cand.pinned or not cand.evictable or cand.size <= 0:
            continue
        victims.append(cand.key)
        excess -= cand.size
        if excess <= 0:
            return victims
    return None
