"""``astream.sampling`` exports exactly its ``__all__``, each name owned by the facade."""

from __future__ import annotations

import astream.sampling as sampling


def test_all_is_what_is_exported() -> None:
    public = {name for name in dir(sampling) if not name.startswith("_")}
    public -= {"annotations"}
    assert public == set(sampling.__all__)


def test_public_callables_belong_to_the_facade() -> None:
    for name in sampling.__all__:
        obj = getattr(sampling, name)
        if callable(obj):
            assert obj.__module__ == "astream.sampling", name
