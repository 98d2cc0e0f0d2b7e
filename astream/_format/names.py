"""Names other people wrote, checked before they become paths.

A shard's ``basename`` in ``index.json``, a key in a bucket's listing, a ``split``: each is
joined under a folder astream writes to (the cache) or reads from. One rule decides
whether such a name stays inside that folder, whatever the folder: relative, ``/``
separated, every component a real name (not empty, ``.`` or ``..``), no NUL (the kernel
cuts the path there) and no backslash (a separator on Windows, and in no MDS writer's
names). The rule is pure, so each place a name enters applies it before joining anything,
and the error names the place (the index field, the listed URL, the parameter).
"""

from __future__ import annotations

import os
from typing import TypeVar

from astream.errors import ConfigError, IndexFormatError

__all__ = ["check_split", "checked_listing", "unsafe_name"]

T = TypeVar("T")


def unsafe_name(name: object, max_parts: int | None = None) -> str | None:
    """Why ``name`` cannot be a path under a folder, or None if it can.

    Args:
        name: the name as it was read (anything: a JSON value, a listed key).
        max_parts: the most ``/``-separated components it may have (None: any number).
    """
    if not isinstance(name, str):
        return f"is not a string ({type(name).__name__})"
    if not name:
        return "is empty"
    if "\0" in name:
        return "holds a NUL byte"
    if "\\" in name:
        return "holds a backslash"
    if name.startswith("/"):
        return "is an absolute path"
    parts = name.split("/")
    if any(part in ("", ".", "..") for part in parts):
        return "has an empty, '.' or '..' component"
    if max_parts is not None and len(parts) > max_parts:
        return f"has {len(parts)} components (at most {max_parts})"
    return None


def check_split(split: object) -> None:
    """Refuse a ``split`` that is not a relative sub-folder name (``"../up"``, ``"/abs"``).

    Raises:
        ConfigError: the split would lead outside ``remote`` and ``local``.
    """
    if split is None or split == "":
        return
    name = os.fspath(split) if isinstance(split, os.PathLike) else split
    why = unsafe_name(name)
    if why is not None:
        raise ConfigError(f"split={split!r} {why}; a split is a sub-folder of remote and local, "
                          "like 'train' or 'val'")


def checked_listing(url: str, entries: list[tuple[str, T]]) -> list[tuple[str, T]]:
    """``entries`` sorted by name, once every name is a safe relative path under ``url``.

    The one check of listed names, where they enter: a key ``../../escape.tar`` would
    otherwise become a cache path outside the cache (a WebDataset scan's copy, the
    folders ``astream index`` makes).

    Raises:
        IndexFormatError: a name is absolute, has an empty, ``.`` or ``..`` component, a
            NUL or a backslash (the whole listing is refused: nothing was fetched yet).
    """
    for name, _ in entries:
        why = unsafe_name(name)
        if why is not None:
            raise IndexFormatError(
                f"{url}: the listing names {name!r}, which {why}; astream reads only objects whose names are "
                "safe relative paths: rename or remove that object"
            )
    return sorted(entries, key=lambda entry: entry[0])
