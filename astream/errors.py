"""The exception tree of astream.

Every failure a user can meet is an :class:`AstreamError`. Each message names the
culprit (file, URL, shard, sample, parameter) and says what to do about it. Where a
builtin exception describes the same failure, the astream class inherits it too, so
``except ValueError`` or ``except TimeoutError`` in existing code keeps working.

::

    AstreamError
    ├── ConfigError (ValueError)            a parameter is wrong; nothing was done yet
    │   ├── SampleIndexError (IndexError)   a sample index outside the dataset
    │   └── OutputExistsError (FileExistsError)  a writer's ``out`` already holds files
    ├── UsageError (RuntimeError)           the API was used in a way it does not support
    ├── MissingExtraError (ImportError)     an optional dependency is not installed
    ├── FormatError (ValueError)            bytes on disk are not valid MDS
    │   ├── IndexFormatError                index.json is missing, unreadable or malformed
    │   │   └── IndexJSONError (json.JSONDecodeError)  index.json is empty or not JSON
    │   ├── ShardFormatError                a shard file is truncated or inconsistent
    │   ├── EncodingError                   unknown encoding, or a value that does not decode
    │   ├── CompressionError                unknown codec, or bytes that do not decompress
    │   └── UnsafeTypeError                 a pickle column without allow_unsafe_types=True
    ├── SampleError (ValueError)            a sample handed to MDSWriter does not fit its columns
    ├── HashMismatchError (ValueError)      a file's digest differs from index.json
    │   └── ServedSamplesError              samples served while their shard arrived differ from its final file
    ├── StorageError (OSError)              a remote could not be read or written
    │   ├── DownloadError                   a download failed for good (after retries)
    │   │   ├── RemoteNotFoundError (FileNotFoundError)
    │   │   ├── AccessDeniedError (PermissionError)  credentials missing or refused
    │   │   ├── RangeNotSupportedError      the remote cannot serve a byte range
    │   │   ├── DownloadTimeout (TimeoutError)
    │   │   └── SizeMismatchError           the remote file's size is not what index.json says (truncated?)
    │   └── UploadError                     an upload failed for good
    ├── CacheError                          the local shard cache cannot do what was asked
    ├── CoordinationError                   the processes of a node could not agree
    │   ├── BarrierTimeout (TimeoutError)   a barrier did not complete in time
    │   ├── WatchdogTimeout (TimeoutError)  a wait on a shard or barrier passed its limit
    │   ├── AgentLost                       the connection to the node agent closed
    │   └── ProtocolError                   a peer sent bytes that are not a valid message
    │       └── VersionMismatch             the peer runs another astream version
    ├── StateError (ValueError)             a resumption state does not fit this dataset/world
    │   └── SourceChangedError              a source file (Parquet) changed since its index was built
    ├── TransformError                      a transform or a subclass's __getitem__ raised on a sample
    ├── BadDataError (ValueError)           on_bad_sample="skip" met more bad samples than max_bad_samples
    └── WorkerError (RuntimeError)          a loader worker died or raised

    CacheWarning (UserWarning)              the cache works, but will mostly re-download
    LayoutWarning (UserWarning)             the data's layout fights streaming (row groups too big/small)
"""

from __future__ import annotations

import json

__all__ = [
    "AccessDeniedError",
    "AgentLost",
    "AstreamError",
    "BadDataError",
    "BarrierTimeout",
    "CacheError",
    "CacheWarning",
    "CompressionError",
    "ConfigError",
    "CoordinationError",
    "DownloadError",
    "DownloadTimeout",
    "EncodingError",
    "FormatError",
    "HashMismatchError",
    "IndexFormatError",
    "IndexJSONError",
    "LayoutWarning",
    "MissingExtraError",
    "OutputExistsError",
    "ProtocolError",
    "RangeNotSupportedError",
    "RemoteNotFoundError",
    "SampleError",
    "SampleIndexError",
    "ServedSamplesError",
    "ShardFormatError",
    "SizeMismatchError",
    "SourceChangedError",
    "StateError",
    "StorageError",
    "TransformError",
    "UnsafeTypeError",
    "UploadError",
    "UsageError",
    "VersionMismatch",
    "WatchdogTimeout",
    "WorkerError",
]


class AstreamError(Exception):
    """Root of every error astream raises on purpose."""


class ConfigError(AstreamError, ValueError):
    """A parameter has a value astream cannot work with; raised before any I/O."""


class SampleIndexError(ConfigError, IndexError):
    """A sample index outside ``[-len, len)``; an ``IndexError`` too, so datasets act as sequences."""


class OutputExistsError(ConfigError, FileExistsError):
    """A writer's ``out`` exists and is not empty, and ``exist_ok`` is False; a
    ``FileExistsError`` too, as MosaicML's writers raise."""


class UsageError(AstreamError, RuntimeError):
    """The API was called in a way it does not support (wrong flavour, closed object...)."""


class MissingExtraError(AstreamError, ImportError):
    """An optional dependency is needed; the message names the pip extra to install."""

    def __init__(self, feature: str, extra: str, module: str) -> None:
        super().__init__(
            f"{feature} needs the optional module {module!r}: "
            f"install it with `pip install 'astream[{extra}]'`"
        )
        self.extra = extra


class FormatError(AstreamError, ValueError):
    """Bytes that should be MDS are not."""


class IndexFormatError(FormatError):
    """index.json is missing, unreadable, or has a malformed field."""


class IndexJSONError(IndexFormatError, json.JSONDecodeError):
    """index.json is empty or not valid JSON; a ``json.JSONDecodeError`` too, which MosaicML
    raises for such a file (``pos``, ``lineno`` and ``colno`` are the parser's; ``doc`` is
    left empty, not the whole file)."""

    def __init__(self, message: str, pos: int = 0, lineno: int = 1, colno: int = 1) -> None:
        ValueError.__init__(self, message)  # (the message is astream's, not the parser's "msg: line...")
        self.msg, self.doc, self.pos, self.lineno, self.colno = message, "", pos, lineno, colno

    def __reduce__(self) -> tuple[type[IndexJSONError], tuple[str, int, int, int]]:
        return type(self), (str(self.args[0]), self.pos, self.lineno, self.colno)


class ShardFormatError(FormatError):
    """A shard file is truncated, has bad offsets, or disagrees with index.json."""


class EncodingError(FormatError):
    """An unknown column encoding, or encoded bytes that do not decode."""


class CompressionError(FormatError):
    """An unknown compression algorithm, or bytes that do not decompress."""


class UnsafeTypeError(FormatError):
    """A column would unpickle data, and ``allow_unsafe_types=True`` was not given."""


class SampleError(AstreamError, ValueError):
    """A sample given to the writer does not match its columns; nothing was written for it."""


class HashMismatchError(AstreamError, ValueError):
    """A file's digest differs from the one recorded in index.json."""


class ServedSamplesError(HashMismatchError):
    """Samples read from a shard while it was still arriving differ from the file installed.

    The shard was downloaded again (a failed check, a restarted transfer, a remote that
    changed) after some of its samples had been handed out: those samples may be wrong, so
    the epoch stops instead of going on with them.
    """


class StorageError(AstreamError, OSError):
    """A remote (or the local disk) could not be read or written."""


class DownloadError(StorageError):
    """A download failed for good; the message names the URL, attempts and last cause."""


class RemoteNotFoundError(DownloadError, FileNotFoundError):
    """The remote object does not exist (HTTP 404, S3 NoSuchKey, missing file)."""


class AccessDeniedError(DownloadError, PermissionError):
    """The remote refused the credentials, or none were found; the message names what to set."""


class RangeNotSupportedError(DownloadError):
    """The backend or server cannot serve a byte range of an object."""


class DownloadTimeout(DownloadError, TimeoutError):
    """A download did not finish within ``download_timeout`` on every attempt."""


class SizeMismatchError(DownloadError):
    """A remote file's size differs from what index.json recorded: truncated, or changed since."""


class UploadError(StorageError):
    """An upload of a finished shard failed for good."""


class CacheError(AstreamError):
    """The local shard cache cannot do what was asked (too small a limit, disk full...)."""


class CacheWarning(UserWarning):
    """The cache works, but less well than it could (e.g. a shuffle wider than ``cache_limit``)."""


class CoordinationError(AstreamError):
    """The processes of a node could not coordinate (agent gone, protocol mismatch...)."""


class BarrierTimeout(CoordinationError, TimeoutError):
    """A barrier did not complete in time; the message names the missing parties."""


class WatchdogTimeout(CoordinationError, TimeoutError):
    """A wait on a shard or barrier passed the watchdog's failure limit."""


class AgentLost(CoordinationError):
    """The connection to the node agent closed (it died, or shut down)."""


class ProtocolError(CoordinationError):
    """Bytes from a peer are not a valid frame or message of the coordination protocol."""


class VersionMismatch(ProtocolError):
    """The peer speaks another version of the protocol (another astream release)."""

    def __init__(self, message: str, peer_version: int | None = None) -> None:
        super().__init__(message)
        self.peer_version = peer_version


class StateError(AstreamError, ValueError):
    """A resumption state does not fit this dataset or world."""


class SourceChangedError(StateError):
    """A file a stream reads in place (Parquet) differs from the one its index describes;
    the message names the file and how to rebuild the index."""


class LayoutWarning(UserWarning):
    """The data can be streamed, but its layout makes it slow or memory-hungry (the
    message says how to rewrite it)."""


class TransformError(AstreamError):
    """A user's transform (or a subclass's ``__getitem__``/``get_item``) raised on a sample;
    the message names the sample and its shard, the cause is chained."""


class BadDataError(AstreamError, ValueError):
    """More bad samples than ``max_bad_samples`` allows (``on_bad_sample="skip"``).

    Attributes:
        bad: the first bad samples met, as ``(sample, shard file, reason, cause)`` tuples.
    """

    def __init__(self, message: str, bad: tuple[tuple[int, str, str, str], ...] = ()) -> None:
        super().__init__(message)
        self.bad = bad

    def __reduce__(self) -> tuple[type[BadDataError], tuple[str, tuple[tuple[int, str, str, str], ...]]]:
        return (type(self), (str(self), self.bad))


class WorkerError(AstreamError, RuntimeError):
    """A loader worker crashed or raised; the message carries its traceback."""
