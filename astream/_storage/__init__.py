"""Layer 3: async access to remotes by URL scheme (local/file, http(s), s3, gs, azure, hf). See DESIGN.md."""

from astream._storage.base import (
    NO_EVENTS,
    ObjectInfo,
    Storage,
    StorageOptions,
    TransferEvents,
    Transient,
    with_retries,
)
from astream._storage.config import RemoteConfig
from astream._storage.executor import PriorityExecutor
from astream._storage.loop import LoopThread, new_event_loop, run, uvloop_available
from astream._storage.registry import StoragePool, configure, join_url, register, scheme_of, storage_class
from astream._storage.retry import RetryPolicy, Timeouts, parse_retry_after
from astream._storage.sink import BufferedSink, FileSink, Sink

__all__ = [
    "NO_EVENTS",
    "BufferedSink",
    "FileSink",
    "LoopThread",
    "ObjectInfo",
    "PriorityExecutor",
    "RemoteConfig",
    "RetryPolicy",
    "Sink",
    "Storage",
    "StorageOptions",
    "StoragePool",
    "Timeouts",
    "TransferEvents",
    "Transient",
    "configure",
    "join_url",
    "new_event_loop",
    "parse_retry_after",
    "register",
    "run",
    "scheme_of",
    "storage_class",
    "uvloop_available",
    "with_retries",
]
