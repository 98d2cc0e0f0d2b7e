"""Checks of parameters that raise :class:`~astream.errors.ConfigError`: the one place.

Every layer validates ints, choices and durations with these (sizes go through
:mod:`astream._units`), so a bad parameter is named, with what it may be, before a
single byte is downloaded.
"""

from __future__ import annotations

import numbers
from collections.abc import Collection

from astream.errors import ConfigError

__all__ = ["check_choice", "check_int", "check_optional_int", "check_seconds"]


def check_choice(name: str, value: object, allowed: Collection[str]) -> str:
    """Return ``value`` if it is one of ``allowed``.

    Raises:
        ConfigError: ``value`` is not one of ``allowed``.
    """
    if not isinstance(value, str) or value not in allowed:
        choices = ", ".join(repr(a) for a in allowed)
        raise ConfigError(f"{name}={value!r} is not supported; use one of {choices}")
    return value


def check_int(name: str, value: object, minimum: int = 0) -> int:
    """Return ``value`` as an ``int`` if it is an integer ``>= minimum``.

    NumPy integers are accepted (shard sizes often are); bools and floats are not, because
    a ``True`` batch size or a ``2.5`` seed is always a mistake.

    Raises:
        ConfigError: ``value`` is not an integer, or is below ``minimum``.
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Integral):
        raise ConfigError(f"{name} must be an integer >= {minimum}, got {value!r}")
    result = int(value)
    if result < minimum:
        raise ConfigError(f"{name} must be an integer >= {minimum}, got {result}")
    return result


def check_optional_int(name: str, value: object, minimum: int = 0) -> int | None:
    """Like :func:`check_int`, but ``None`` passes through unchanged."""
    return None if value is None else check_int(name, value, minimum)


def check_seconds(name: str, value: object) -> float:
    """Return ``value`` as a float if it is a number of seconds ``> 0``.

    Raises:
        ConfigError: ``value`` is not a positive number (bools are not numbers here).
    """
    if isinstance(value, bool) or not isinstance(value, numbers.Real) or not float(value) > 0:
        raise ConfigError(f"{name} must be a number of seconds > 0, got {value!r}")
    return float(value)
