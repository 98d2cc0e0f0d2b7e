"""ShardCache bookkeeping under random operations (pure: no transfers, files may be absent)."""

from __future__ import annotations

import tempfile
from pathlib import Path

from cachekit import write_dataset
from hypothesis import given, settings
from hypothesis import strategies as st

from astream._cache.cache import ShardCache, State
from astream._format.index import Index

_DIR = tempfile.mkdtemp(prefix="astream-acct-")
INDEX: Index = write_dataset(Path(_DIR) / "ds", shards=6, samples=3, sample_size=500)
SIZE = max(s.raw_data.bytes for s in INDEX.shards)

ops = st.lists(st.tuples(st.sampled_from(["reserve", "done", "fail", "unpin"]), st.integers(0, 5)), max_size=60)


@settings(max_examples=150, deadline=None)
@given(ops=ops, slots=st.integers(2, 6))
def test_accounting_invariants(ops: list[tuple[str, int]], slots: int) -> None:
    cache = ShardCache(INDEX, _DIR + "/cache", limit=slots * SIZE)
    for op, i in ops:
        entry = cache.entries[i]
        if op == "reserve":
            if entry.state is State.ABSENT:
                held = {k for k, e in enumerate(cache.entries) if e.pins and e.state is not State.ABSENT}
                victims = cache.make_room(cache.footprint(i))
                if victims is None:
                    continue
                assert all(cache.entries[v].state is State.ABSENT for v in victims)
                assert not held & set(victims), "a pinned shard was evicted"
                cache.begin(i)
            cache.pin(i)
        elif op == "done" and entry.state is State.BUSY:
            cache.done(i)
        elif op == "fail" and entry.state is State.BUSY:
            cache.forget(i)
        elif op == "unpin" and entry.pins > 0:
            cache.unpin(i)
        # bytes add up, never above the limit, and pinned shards are never dropped
        assert cache.used == sum(e.size for e in cache.entries)
        assert cache.used <= cache.limit  # type: ignore[operator]
        assert all(e.size == 0 for e in cache.entries if e.state is State.ABSENT)
