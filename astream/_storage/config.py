"""``storage_options``: the per-remote settings a user hands to a backend, frozen and checked.

A mapping such as ``{"endpoint_url": ..., "anonymous": True, "headers": {...}}`` (the
convention of pandas, Dask and Hugging Face) becomes a :class:`RemoteConfig`: a frozen,
hashable, picklable value (dicts and lists inside are frozen too), so it can sit in a
``Stream``, travel to spawned workers and key a pool of backends. Which keys a scheme
accepts is declared where the scheme is registered; a key no backend of that scheme reads
is a :class:`ConfigError` naming it, never silently ignored.

``timeout`` and ``connect_timeout`` are common to every backend and become the
:class:`Timeouts` of :class:`StorageOptions`; the rest stays for the backend to read.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from typing import Any

from astream.errors import ConfigError

__all__ = ["COMMON_KEYS", "PUBLIC_KEYS", "RemoteConfig", "freeze"]

# Keys every backend accepts: they set the per-attempt timeouts of StorageOptions.
COMMON_KEYS = frozenset({"timeout", "connect_timeout"})
# Options whose values say where and how, never who: shown in reprs and messages. Every
# other value (keys, secrets, tokens, SAS, header values, a registered backend's own
# options) is shown as '***': a repr of a dataset or its config goes to logs.
PUBLIC_KEYS = COMMON_KEYS | frozenset({
    "endpoint_url", "endpoint", "region", "anonymous", "requester_pays", "ca_bundle", "verify_ssl",
    "account_name", "project", "profile", "service_file",
})


def freeze(value: Any, where: str) -> Any:
    """A hashable copy of ``value``: mappings become sorted tuples of pairs, lists tuples.

    Raises:
        ConfigError: a value that cannot be frozen (a set, an open file...).
    """
    if isinstance(value, Mapping):
        return _Frozen(tuple(sorted((str(k), freeze(v, f"{where}[{k!r}]")) for k, v in value.items())))
    if isinstance(value, (list, tuple)):
        return tuple(freeze(v, where) for v in value)
    if value is None or isinstance(value, (str, bytes, int, float, bool)):
        return value
    raise ConfigError(
        f"storage_options {where}: {type(value).__name__} values are not supported "
        "(use strings, numbers, booleans, lists and dicts: the options must be picklable)"
    )


class _Frozen(tuple):  # type: ignore[type-arg]
    """A frozen mapping (a tuple of pairs), told apart from a frozen list."""

    __slots__ = ()

    def thaw(self) -> dict[str, Any]:
        return {k: _thaw(v) for k, v in self}


def _thaw(value: Any) -> Any:
    if isinstance(value, _Frozen):
        return value.thaw()
    if isinstance(value, tuple):
        return [_thaw(v) for v in value]
    return value


@dataclass(frozen=True)
class RemoteConfig:
    """The ``storage_options`` of one remote, frozen (hashable and picklable).

    Attributes:
        items: the options as sorted ``(key, frozen value)`` pairs.
    """

    items: tuple[tuple[str, Any], ...] = ()

    @classmethod
    def of(cls, options: Mapping[str, Any] | RemoteConfig | None) -> RemoteConfig:
        """Freeze a user's mapping (None and an existing RemoteConfig pass through).

        Raises:
            ConfigError: not a mapping, a key that is not a string, a value that cannot be frozen.
        """
        if options is None:
            return EMPTY
        if isinstance(options, RemoteConfig):
            return options
        if not isinstance(options, Mapping):
            raise ConfigError(f"storage_options must be a mapping (a dict), got {type(options).__name__}")
        for key in options:
            if not isinstance(key, str):
                raise ConfigError(f"storage_options keys must be strings, got {key!r}")
        frozen = freeze(options, "")
        return cls(tuple(frozen))

    def __bool__(self) -> bool:
        return bool(self.items)

    def __repr__(self) -> str:
        return f"RemoteConfig({', '.join(f'{k}={_shown(k, v)}' for k, v in self.items)})"

    def keys(self) -> list[str]:
        """The option names given."""
        return [k for k, _ in self.items]

    def get(self, key: str, default: Any = None) -> Any:
        """The option ``key`` (mappings and lists thawed back to dict and list), or ``default``."""
        for k, v in self.items:
            if k == key:
                return _thaw(v)
        return default

    def check(self, url: str, accepted: Iterable[str]) -> None:
        """Refuse keys outside ``accepted`` (and the common ones).

        Raises:
            ConfigError: names the first unknown key, the URL and the keys accepted.
        """
        allowed = set(accepted) | COMMON_KEYS
        for key in self.keys():
            if key not in allowed:
                raise ConfigError(
                    f"storage_options for {url!r}: unknown key {key!r}; this remote accepts "
                    f"{', '.join(sorted(allowed))}"
                )

    def text(self, key: str, url: str) -> str | None:
        """The option ``key`` as a non-empty string, or None when absent.

        Raises:
            ConfigError: present but not a non-empty string.
        """
        value = self.get(key)
        if value is None:
            return None
        if not isinstance(value, str) or not value:
            raise ConfigError(f"storage_options for {url!r}: {key} must be a non-empty string, "
                              f"got {_shown(key, value)}")
        return value

    def flag(self, key: str, url: str, default: bool = False) -> bool:
        """The option ``key`` as a bool.

        Raises:
            ConfigError: present but not a bool.
        """
        value = self.get(key, default)
        if not isinstance(value, bool):
            raise ConfigError(f"storage_options for {url!r}: {key} must be True or False, got {value!r}")
        return value

    def headers(self, url: str) -> dict[str, str]:
        """The ``headers`` option: extra HTTP headers of every request.

        Raises:
            ConfigError: not a mapping of strings to strings.
        """
        value = self.get("headers", {})
        if not isinstance(value, dict) or not all(isinstance(k, str) and isinstance(v, str) for k, v in value.items()):
            raise ConfigError(f"storage_options for {url!r}: headers must map strings to strings, got "
                              f"{_shown('headers', freeze(value, 'headers'))}")
        return value


def _shown(key: str, value: Any) -> str:
    """``value`` of option ``key`` as reprs and messages may show it (secrets masked)."""
    if key in PUBLIC_KEYS:
        return repr(_thaw(value))
    if key == "headers" and isinstance(value, _Frozen):  # names tell what is set; values may be tokens
        return "{" + ", ".join(f"{k!r}: {_masked(v)}" for k, v in value) + "}"
    return _masked(value)


def _masked(value: Any) -> str:
    return "'***'" if isinstance(value, str) else f"<{type(value).__name__}>"


EMPTY = RemoteConfig()
