"""The front door: ``astream.__all__`` lists exactly the public names it exports."""

from __future__ import annotations

import types

import astream


def _exported() -> set[str]:
    names = {"__version__"}
    for name, value in vars(astream).items():
        if name.startswith("_"):
            continue
        if isinstance(value, types.ModuleType):
            if value.__name__.startswith("astream."):  # public sub-namespaces (astream.errors)
                names.add(name)
            continue
        if getattr(value, "__module__", "").startswith("astream"):
            names.add(name)
    return names


def test_all_is_what_is_exported() -> None:
    assert sorted(astream.__all__) == sorted(_exported())
    assert len(astream.__all__) == len(set(astream.__all__))


def test_public_classes_present_themselves_as_astream() -> None:
    for name in astream.__all__:
        value = getattr(astream, name)
        if isinstance(value, type) and not issubclass(value, BaseException):
            assert value.__module__ == "astream", name
