"""One record layout per distinct set of columns: shared by the shards that repeat them, checked once."""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path

import pytest

from astream._format.index import Index
from astream._format.kinds import layout_of
from astream.errors import UnsafeTypeError

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures"


def test_shards_with_the_same_columns_share_one_layout() -> None:
    index = Index.load(FIXTURES / "mds" / "layouts" / "many_small_40" / "index.json")
    layouts = {id(layout_of(info, index.source, False)) for info in index.shards}
    assert len(layouts) == 1


def test_other_columns_or_another_safety_choice_get_their_own() -> None:
    index = Index.load(FIXTURES / "mds" / "layouts" / "uneven_10" / "index.json")
    info = index.shards[0]
    renamed = replace(info, column_names=tuple(f"{n}_2" for n in info.column_names))
    assert layout_of(renamed, index.source, False) is not layout_of(info, index.source, False)
    assert layout_of(renamed, index.source, False).names == renamed.column_names
    assert layout_of(info, index.source, True) is not layout_of(info, index.source, False)


def test_an_unsafe_column_is_refused_for_every_shard_not_only_the_first() -> None:
    index = Index.load(FIXTURES / "mds" / "layouts" / "many_small_40" / "index.json")
    info = index.shards[0]
    pickled = replace(info, column_encodings=("pkl",) * len(info.column_names),
                      column_sizes=(None,) * len(info.column_names))
    layout_of(pickled, index.source, True)  # allowed: made and kept
    for _ in range(2):
        with pytest.raises(UnsafeTypeError):
            layout_of(pickled, index.source, False)
