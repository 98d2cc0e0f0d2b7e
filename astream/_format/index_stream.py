"""``index.json`` parsed one shard entry at a time (for the node's binary index builder).

:meth:`Index.from_bytes` decodes the whole document before it validates an entry: at a
million shards that is ~4 GB of Python objects, held until the last entry is checked. Here
the top level is walked by hand and each entry decoded by the standard library's scanner
(:meth:`json.JSONDecoder.raw_decode`, the same C code ``json.loads`` runs), validated by the
same :meth:`ShardInfo.from_json` and handed on; only the text and one entry are held.

The complete fast operation tried first: :func:`stream_shards` takes only the plain shape
(one object, each key once, ``version`` 2, a list of ``shards``) and raises :class:`Unusual`
at anything else, or raises what the validator raised; the caller then reads the file the
one general way (:meth:`Index.from_bytes`), whose error (or index) is the answer. So any
document gives the same shards, or the same error, as the general reader.
"""

from __future__ import annotations

import dataclasses
import json
import re
from collections.abc import Iterator
from typing import Any

from astream._format.index import _FILE_KEYS, _ONE_FILE, MAX_INT, FileInfo, ShardInfo
from astream.errors import IndexFormatError

__all__ = ["Unusual", "stream_shards"]

_SPACE = re.compile(r"[ \t\n\r]*")  # JSON's whitespace
_DECODER = json.JSONDecoder()


class Unusual(Exception):
    """The text is not of the plain shape :func:`stream_shards` walks (the general reader decides)."""


class _Entries:
    """:meth:`ShardInfo.from_json` of each entry, the writer's config checked once a run.

    A writer repeats its config in every entry; an entry whose config equals the last one
    validated needs only its own fields checked (samples and files, by the same
    :meth:`FileInfo.from_json`), and is the last one with those replaced. Anything else, or
    any doubt, goes through :meth:`ShardInfo.from_json` itself, whose answer (or error) it is.
    At a million shards the validator was ~50 µs an entry, most of the build.
    """

    def __init__(self, source: str) -> None:
        self.source = source
        self.last: ShardInfo | None = None

    def __call__(self, obj: Any, position: int) -> ShardInfo:
        last = self.last
        if last is not None and isinstance(obj, dict):
            try:
                got = self._like(last, obj, position)
            except IndexFormatError:
                got = None
            if got is not None:
                return got
        info = self.last = ShardInfo.from_json(obj, position, self.source)
        return info

    def _like(self, last: ShardInfo, obj: dict[str, Any], position: int) -> ShardInfo | None:
        if last.source is not None or {k: v for k, v in obj.items() if k not in (*_FILE_KEYS, "samples", "source")} \
                != last.config:
            return None
        samples = obj.get("samples")
        if isinstance(samples, bool) or not isinstance(samples, int) or not 0 <= samples <= MAX_INT:
            return None
        raw = FileInfo.from_json(obj.get("raw_data"), "", self.source)
        zipped = None if obj.get("zip_data") is None else FileInfo.from_json(obj["zip_data"], "", self.source)
        if (zipped is None) != (last.compression is None):
            return None
        raw_meta = zip_meta = None
        if last.format not in _ONE_FILE:
            raw_meta = FileInfo.from_json(obj.get("raw_meta"), "", self.source)
            zip_meta = None if obj.get("zip_meta") is None else FileInfo.from_json(obj["zip_meta"], "", self.source)
        return dataclasses.replace(last, index=position, samples=samples, raw_data=raw, zip_data=zipped,
                                   raw_meta=raw_meta, zip_meta=zip_meta)


def _expect(text: str, pos: int, char: str) -> int:
    """The position after ``char`` (and the whitespace after it), which must be at ``pos``."""
    if not text.startswith(char, pos):
        raise Unusual(f"{char!r} expected at {pos}")
    return _SPACE.match(text, pos + 1).end()  # type: ignore[union-attr]


def stream_shards(text: str, source: str) -> Iterator[ShardInfo]:
    """Each shard entry of the ``index.json`` text, validated, in order.

    Raises:
        Unusual: not the plain shape (checked to the end: the caller must not keep what was
            yielded before it).
        IndexFormatError, ValueError, RecursionError: as the validator or the scanner raise.
    """
    pos = _expect(text, _SPACE.match(text, 0).end(), "{")  # type: ignore[union-attr]
    seen: set[str] = set()
    version: object = None
    total = 0
    while True:
        key, pos = _DECODER.raw_decode(text, pos)
        if not isinstance(key, str) or key in seen:
            raise Unusual("a key that is not a string, or given twice")
        seen.add(key)
        pos = _expect(text, _SPACE.match(text, pos).end(), ":")  # type: ignore[union-attr]
        if key == "shards":
            pos = _expect(text, pos, "[")
            position = 0
            entry = _Entries(source)
            while not text.startswith("]", pos):
                obj, pos = _DECODER.raw_decode(text, pos)
                info = entry(obj, position)
                total += info.samples
                position += 1
                yield info
                pos = _SPACE.match(text, pos).end()  # type: ignore[union-attr]
                if text.startswith(",", pos):
                    pos = _SPACE.match(text, pos + 1).end()  # type: ignore[union-attr]
                elif not text.startswith("]", pos):
                    raise Unusual(f"',' or ']' expected at {pos}")
            pos += 1
        else:
            value, pos = _DECODER.raw_decode(text, pos)
            if key == "version":
                version = value
        pos = _SPACE.match(text, pos).end()  # type: ignore[union-attr]
        if text.startswith("}", pos):
            break
        pos = _expect(text, pos, ",")
    if _SPACE.match(text, pos + 1).end() != len(text):  # type: ignore[union-attr]
        raise Unusual("text after the index's object")
    if "shards" not in seen or version != 2 or total > MAX_INT:
        raise Unusual("no shards, another version, or too many samples")
