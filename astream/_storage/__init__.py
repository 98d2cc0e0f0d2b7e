"""Layer 3: async access to remotes by URL scheme (local/file, http(s), s3). See DESIGN.md."""

from astream._storage.base import NO_EVENTS, Storage, StorageOptions, TransferEvents, Transient, with_retries
from astream._storage.registry import StoragePool, join_url, register, scheme_of, storage_class
from astream._storage.retry import RetryPolicy, Timeouts, parse_retry_after
from astream._storage.sink import BufferedSink, FileSink, Sink

__all__ = [
    "NO_EVENTS",
    "BufferedSink",
    "FileSink",
    "RetryPolicy",
    "Sink",
    "Storage",
    "StorageOptions",
    "StoragePool",
    "Timeouts",
    "TransferEvents",
    "Transient",
    "join_url",
    "parse_retry_after",
    "register",
    "scheme_of",
    "storage_class",
    "with_retries",
]
