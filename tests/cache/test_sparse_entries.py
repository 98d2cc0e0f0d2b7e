"""A cache of many shards keeps entries only for those touched, and does not walk a folder
that holds no shard; what it finds is what the full scan finds."""

from __future__ import annotations

import shutil
from pathlib import Path

from cachekit import write_dataset

from astream._cache.cache import ShardCache, State
from astream._cache.node_index import attach_index, binary_path
from astream._cache.origin import ORIGIN_NAME
from astream._cache.states import Entries


def test_entries_are_made_when_touched() -> None:
    entries = Entries(5)
    assert len(entries) == 5
    assert [e.state for e in entries] == [State.ABSENT] * 5
    assert entries.touched() == []
    entries[3].found(10, False)
    entries[-1].pins += 1
    assert [i for i, _ in entries.touched()] == [3, 4]
    assert entries[3] is entries[3]
    assert [e.size for e in entries[2:4]] == [0, 10]
    assert not entries.all_ready()


def test_a_folder_with_only_astreams_own_files_holds_no_shard(tmp_path: Path) -> None:
    index = write_dataset(tmp_path / "ds", shards=4, samples=2)
    root = tmp_path / "cache"
    root.mkdir()
    shutil.copy(tmp_path / "ds" / "index.json", root / "index.json")
    (root / ORIGIN_NAME).write_text("{}")
    attached = attach_index(str(root / "index.json"))
    assert Path(binary_path(str(root / "index.json"))).exists()
    assert ShardCache(attached, str(root)).scan() == []
    # A shard's file in place (decompressed, as installed): found, by the full scan.
    raw = tmp_path / "raw.bin"
    raw.write_bytes(b"\0" * index.shards[2].raw_data.bytes)
    shutil.copy(raw, root / index.shards[2].raw_data.basename)
    cache = ShardCache(attached, str(root))
    assert cache.scan() == [2]
    assert cache.entries[2].state is State.READY
    assert [i for i, _ in cache.entries.touched()] == [2]
