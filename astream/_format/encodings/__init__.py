"""The registry of MDS column encodings, keyed by name.

``get_encoding("ndarray:float32:3,4")`` parses an encoding string as index.json stores
it and returns a shared, immutable :class:`Encoding`. Parametrised encodings
(``ndarray``) register a factory that receives the text after the first ``:``.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

from astream._format.encodings.base import Buffer, Encoding
from astream._format.encodings.images import (
    JPEGArrayEncoding,
    JPEGEncoding,
    ListEncoding,
    PILEncoding,
    PNGEncoding,
)
from astream._format.encodings.ndarray import NDArrayEncoding
from astream._format.encodings.objects import JSONEncoding, PickleEncoding
from astream._format.encodings.scalars import (
    NUMERIC_DTYPES,
    BytesEncoding,
    IntEncoding,
    NumericEncoding,
    StrDecimalEncoding,
    StrEncoding,
    StrFloatEncoding,
    StrIntEncoding,
)
from astream.errors import EncodingError

__all__ = [
    "ENCODING_NAMES",
    "Buffer",
    "Encoding",
    "encode_value",
    "get_encoding",
    "is_encoding",
    "register_encoding",
]

# name -> factory(args after the first ':' or None) -> Encoding
_REGISTRY: dict[str, Callable[[str | None], Encoding]] = {}


def register_encoding(name: str, factory: Callable[[str | None], Encoding]) -> None:
    """Add an encoding under ``name`` (the part of the encoding string before ``:``).

    The factory receives the text after the first ``:`` (or None) and should raise
    EncodingError for arguments it does not accept.
    """
    _REGISTRY[name] = factory
    if "get_encoding" in globals():  # parsed encodings may be cached under the old factory
        get_encoding.cache_clear()


def _plain(cls: Callable[[], Encoding], name: str) -> Callable[[str | None], Encoding]:
    def factory(args: str | None) -> Encoding:
        if args is not None:
            raise EncodingError(f"encoding {name!r} takes no parameters, got '{name}:{args}'")
        return cls()

    return factory


for _name, _cls in {
    "bytes": BytesEncoding, "str": StrEncoding, "int": IntEncoding,
    "str_int": StrIntEncoding, "str_float": StrFloatEncoding, "str_decimal": StrDecimalEncoding,
    "json": JSONEncoding, "pkl": PickleEncoding,
    "pil": PILEncoding, "jpeg": JPEGEncoding, "png": PNGEncoding,
}.items():
    register_encoding(_name, _plain(_cls, _name))
for _name in NUMERIC_DTYPES:
    register_encoding(_name, _plain(functools.partial(NumericEncoding, _name), _name))
for _name in ("jpeg_array", "jpegarray"):
    register_encoding(_name, _plain(functools.partial(JPEGArrayEncoding, _name), _name))
for _element in (PILEncoding, JPEGEncoding, PNGEncoding):
    _list_name = f"list[{_element.name}]"
    register_encoding(_list_name, _plain(functools.partial(ListEncoding, _element()), _list_name))
register_encoding("ndarray", NDArrayEncoding.from_spec)

ENCODING_NAMES: tuple[str, ...] = tuple(sorted(_REGISTRY))


@functools.lru_cache(maxsize=1024)
def get_encoding(spec: str) -> Encoding:
    """The encoding for an encoding string (``"int"``, ``"ndarray:uint8:8"``...).

    Raises:
        EncodingError: the name is unknown or its parameters are invalid.
    """
    if not isinstance(spec, str):
        raise EncodingError(f"an encoding must be a string like 'int' or 'ndarray:float32', got {spec!r}")
    name, sep, args = spec.partition(":")
    factory = _REGISTRY.get(name)
    if factory is None:
        raise EncodingError(
            f"unknown encoding {spec!r}; MDS encodings are {', '.join(sorted(_REGISTRY))} "
            "(ndarray also as 'ndarray:DTYPE' and 'ndarray:DTYPE:D0,D1,...')"
        )
    return factory(args if sep else None)


def is_encoding(spec: str) -> bool:
    """True if ``spec`` is a valid encoding string."""
    try:
        get_encoding(spec)
    except EncodingError:
        return False
    return True


def encode_value(encoding: Encoding, value: Any) -> bytes:
    """Encode ``value`` for a column, as MDS writers do.

    A value that already is ``bytes`` is stored verbatim whatever the encoding (this is
    how ready-made JPEG files go into a ``jpeg`` column).

    Raises:
        SampleError: the value does not fit the encoding.
    """
    if isinstance(value, bytes):
        return value
    return encoding.encode(value)
