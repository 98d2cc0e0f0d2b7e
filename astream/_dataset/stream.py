"""``Stream``: one source of samples (a remote and/or local dataset) and its weight.

A ``Stream`` holds configuration only (picklable, no I/O). Settings left as ``None``
inherit the dataset's (``download_retry``, ``download_timeout``, ``validate_hash``,
``keep_zip``, ``storage_options``), as in MosaicML Streaming.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass, replace
from typing import Any, overload

import xxhash

from astream._cache.origin import default_cache_base
from astream._checks import check_optional_int, check_seconds
from astream._format.hashing import check_algorithm
from astream._format.names import check_split
from astream._storage.config import RemoteConfig
from astream._storage.registry import configure
from astream.errors import ConfigError

__all__ = ["FORMATS", "Stream", "default_cache_dir"]

FORMATS = ("mds", "parquet", "webdataset")


def default_cache_dir(remote: str) -> str:
    """Where a stream without ``local`` is cached: one folder per remote.

    Inside :func:`~astream._cache.origin.default_cache_base` (``$ASTREAM_CACHE_DIR``,
    ``$XDG_CACHE_HOME/astream`` or ``<tmp>/astream-<uid>``, private to the user), a folder
    named by a digest of the remote URL (so two remotes never share a cache). A split is
    a sub-folder of it, as of any local directory.
    """
    return os.path.join(default_cache_base(), xxhash.xxh64(remote.rstrip("/").encode()).hexdigest())


class _Weight:
    """``proportion``, ``repeat`` or ``choose`` of a :class:`Stream`: the value given, until a
    dataset built from the stream resolves all three (MosaicML writes them back into its
    streams); the given one stays what the stream is configured with (:meth:`Stream.given`)."""

    def __set_name__(self, owner: type, name: str) -> None:
        self.name, self.slot = name, f"_given_{name}"

    @overload
    def __get__(self, obj: None, owner: type | None = None) -> None: ...
    @overload
    def __get__(self, obj: Stream, owner: type | None = None) -> Any: ...

    def __get__(self, obj: Stream | None, owner: type | None = None) -> Any:
        if obj is None:
            return None  # (the dataclass field's default)
        resolved = obj.__dict__.get("_resolved")
        return resolved[self.name] if resolved is not None else obj.__dict__.get(self.slot)

    def __set__(self, obj: Stream, value: Any) -> None:
        obj.__dict__[self.slot] = value


@dataclass(frozen=True)
class Stream:
    """One dataset directory mixed into a :class:`StreamingDataset`.

    Args:
        remote: where the shards live (a path, ``file://``, ``http(s)://``, ``s3://``), or
            None for a local-only dataset.
        local: the local cache directory (the dataset itself when ``remote`` is None);
            default: a per-remote folder of the user's private cache (:func:`default_cache_dir`).
        split: a sub-directory of both.
        proportion: relative weight in the mixture (all streams relative, or none).
        repeat: how many times to draw the stream per epoch (may be fractional).
        choose: exactly how many samples to draw per epoch. Once a dataset is built from
            the stream, all three read the resolved weights (its share of the epoch,
            ``choose / samples`` and the samples drawn), as in MosaicML; the values given
            stay in :meth:`given`, and the stream can make another dataset.
        download_retry, download_timeout, validate_hash, keep_zip: override the dataset's.
        storage_options: settings of this remote's backend (endpoint, credentials, region,
            ``anonymous``, ``headers``, ``ca_bundle``, timeouts; see docs/storage.md), kept
            frozen (picklable); an unknown key is refused.
        format: ``"mds"`` (a dataset with an index.json: MDS or MosaicML's text formats) or
            ``"parquet"`` (a folder or prefix of Parquet files read in place, each row group
            a shard) or ``"webdataset"`` (a folder or prefix of tars, plain or gzip, each tar
            a shard; a sample is a dict of extension -> bytes). For these two ``local``
            only caches and defaults to a per-remote folder; a local folder of files may
            be given as ``remote`` or ``local``.
        columns: the columns to read (Parquet only; default all): only their column
            chunks are fetched.

    A dataset's ``validate_hash`` is inherited by its MDS streams only (Parquet files and
    tars have no digests in an index); given on a non-MDS stream it is refused.

    Raises:
        ConfigError: neither remote nor local, several weights at once, bad values.
    """

    remote: str | None = None
    local: str | None = None
    split: str | None = None
    proportion: float | None = _Weight()  # type: ignore[assignment]
    repeat: float | None = _Weight()  # type: ignore[assignment]
    choose: int | None = _Weight()  # type: ignore[assignment]
    download_retry: int | None = None
    download_timeout: float | None = None
    validate_hash: str | None = None
    keep_zip: bool | None = None
    storage_options: Mapping[str, Any] | RemoteConfig | None = None
    format: str = "mds"
    columns: tuple[str, ...] | None = None

    def __post_init__(self) -> None:
        if self.remote is None and self.local is None:
            raise ConfigError("a stream needs remote=, local=, or both (remote=None, local=None given)")
        if self.format not in FORMATS:
            raise ConfigError(f"format must be one of {', '.join(map(repr, FORMATS))}, got {self.format!r}")
        if self.columns is not None:
            if self.format != "parquet":
                raise ConfigError(f"columns= selects Parquet columns; format={self.format!r} reads every column")
            if isinstance(self.columns, str) or not all(isinstance(c, str) for c in self.columns) or not self.columns:
                raise ConfigError(f"columns must be a non-empty list of column names, got {self.columns!r}")
            object.__setattr__(self, "columns", tuple(self.columns))
        if self.format != "mds":
            if self.validate_hash is not None:
                raise ConfigError(f"validate_hash does not apply to format={self.format!r} (its files carry no "
                                  "digests in an index); leave it None")
            if self.remote is None:  # a local folder of Parquet files: read in place, cached elsewhere
                object.__setattr__(self, "remote", self.local)
                object.__setattr__(self, "local", None)
        for name in ("remote", "local", "split"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, (str, os.PathLike)):
                raise ConfigError(f"{name} must be a string or path, got {type(value).__name__}")
        check_split(self.split)
        if self.local is not None:
            object.__setattr__(self, "local", os.fspath(self.local))
        if self.remote is not None:
            object.__setattr__(self, "remote", os.fspath(self.remote))
        given = [n for n in ("proportion", "repeat", "choose") if getattr(self, n) is not None]
        if len(given) > 1:
            raise ConfigError(f"a stream takes at most one of proportion, repeat and choose; got {', '.join(given)}")
        for name in ("proportion", "repeat"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, (int, float)) or value < 0):
                raise ConfigError(f"{name} must be a non-negative number, got {value!r}")
        check_optional_int("choose", self.choose, 0)
        check_optional_int("download_retry", self.download_retry, 0)
        if self.download_timeout is not None:
            check_seconds("download_timeout", self.download_timeout)
        if self.validate_hash is not None:
            check_algorithm(self.validate_hash, "validate_hash")
        if self.storage_options is not None:
            config = RemoteConfig.of(self.storage_options)
            if config and self.remote is None:
                raise ConfigError("storage_options were given for a stream without a remote")
            if config:
                assert self.remote is not None
                configure(self.remote, config)  # refuses an unknown scheme or key now, not in a worker
            object.__setattr__(self, "storage_options", config)

    def given(self) -> tuple[float | None, float | None, int | None]:
        """``(proportion, repeat, choose)`` as given to the constructor (None where not given)."""
        d = self.__dict__
        return d.get("_given_proportion"), d.get("_given_repeat"), d.get("_given_choose")

    def resolve(self, proportion: float, repeat: float, choose: int) -> None:
        """Hold a dataset's resolved weights (what ``proportion``/``repeat``/``choose`` read)."""
        object.__setattr__(self, "_resolved", {"proportion": float(proportion), "repeat": float(repeat),
                                              "choose": int(choose)})

    def resolved(self, proportion: float, repeat: float, choose: int) -> Stream:
        """A copy of this stream holding these resolved weights."""
        given = self.given()
        copy = replace(self, proportion=given[0], repeat=given[1], choose=given[2])
        copy.resolve(proportion, repeat, choose)
        return copy

    @property
    def remote_config(self) -> RemoteConfig:
        """The frozen ``storage_options`` (empty when none were given)."""
        return RemoteConfig.of(self.storage_options)

    @property
    def local_dir(self) -> str:
        """The local directory (chosen from the remote when ``local`` was not given)."""
        if self.local is not None:
            return self.local
        assert self.remote is not None
        return default_cache_dir(self.remote)

    def inherit(
        self,
        *,
        download_retry: int,
        download_timeout: float,
        validate_hash: str | None,
        keep_zip: bool,
        storage_options: RemoteConfig | None = None,
    ) -> Stream:
        """This stream with the dataset's settings filled in where it left them as None."""
        own = self.storage_options is not None
        proportion, repeat, choose = self.given()  # (not weights an earlier dataset resolved)
        return replace(
            self,
            proportion=proportion, repeat=repeat, choose=choose,
            storage_options=self.storage_options if own or self.remote is None else storage_options,
            local=self.local_dir,
            download_retry=self.download_retry if self.download_retry is not None else download_retry,
            download_timeout=self.download_timeout if self.download_timeout is not None else download_timeout,
            validate_hash=(self.validate_hash if self.validate_hash is not None or self.format != "mds"
                           else validate_hash),
            keep_zip=self.keep_zip if self.keep_zip is not None else keep_zip,
        )
