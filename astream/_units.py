"""Parsing of human-readable sizes and counts (``"64mb"``, ``"10gb"``, ``"64M"``).

Byte sizes use powers of 1024 (as MosaicML Streaming's ``bytes_to_int``); sample
counts use powers of 1000 (its ``number_abbrev_to_int``).
"""

from __future__ import annotations

import re

from astream.errors import ConfigError

_BYTE_UNITS = {
    "b": 0, "kb": 1, "mb": 2, "gb": 3, "tb": 4, "pb": 5, "eb": 6, "zb": 7, "yb": 8,
    "k": 1, "m": 2, "g": 3, "t": 4, "p": 5, "e": 6, "z": 7, "y": 8,
}
_COUNT_UNITS = {"": 0, "k": 1, "m": 2, "b": 3, "t": 4}
_NUMBER = re.compile(r"^\s*([0-9]*\.?[0-9]+(?:e[+-]?[0-9]+)?)\s*([a-z]*)\s*$")


def parse_bytes(value: int | str, name: str) -> int:
    """Turn ``value`` (an int, or a string like ``"64mb"``, or of digits alone: bytes) into a number of bytes.

    Raises:
        ConfigError: the value is negative, not a number, or has an unknown unit.
    """
    if isinstance(value, bool):
        raise ConfigError(f"{name} must be a number of bytes or a string like '64mb', got {value!r}")
    if isinstance(value, int):
        result = value
    elif isinstance(value, str):
        match = _NUMBER.match(value.lower())
        # A string of digits alone is bytes, as MosaicML reads it ("2048"); "1.5" is not.
        plain = match is not None and not match.group(2) and match.group(1).isdigit()
        if not match or (match.group(2) not in _BYTE_UNITS and not plain):
            raise ConfigError(
                f"{name}={value!r} is not a size: use an int or a string like '2048', '512kb', '64mb', '10gb'"
            )
        result = int(match.group(1)) if plain else int(float(match.group(1)) * 1024 ** _BYTE_UNITS[match.group(2)])
    else:
        raise ConfigError(f"{name} must be an int or a string like '64mb', got {type(value).__name__}")
    if result < 0:
        raise ConfigError(f"{name} must not be negative, got {value!r}")
    return result


def parse_count(value: int | str, name: str) -> int:
    """Turn ``value`` (an int, or a string like ``"64M"``) into a count (powers of 1000).

    Raises:
        ConfigError: the value is negative, not a number, or has an unknown suffix.
    """
    if isinstance(value, bool):
        raise ConfigError(f"{name} must be a count or a string like '64M', got {value!r}")
    if isinstance(value, int):
        result = value
    elif isinstance(value, str):
        match = _NUMBER.match(value.lower())
        if not match or match.group(2) not in _COUNT_UNITS:
            raise ConfigError(f"{name}={value!r} is not a count: use an int or a string like '100k', '64m', '2b'")
        result = int(float(match.group(1)) * 1000 ** _COUNT_UNITS[match.group(2)])
    else:
        raise ConfigError(f"{name} must be an int or a string like '64M', got {type(value).__name__}")
    if result < 0:
        raise ConfigError(f"{name} must not be negative, got {value!r}")
    return result
