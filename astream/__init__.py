"""astream: stream sharded MDS datasets into any Python training loop.

The public names live here; the implementation is in private packages (see DESIGN.md).
"""

from __future__ import annotations

import contextlib

from astream import convert, errors
from astream._coord.config import CoordConfig
from astream._coord.world import World
from astream._dataset.dataset import StreamingDataset
from astream._dataset.loader import Loader
from astream._dataset.stats import Stats
from astream._dataset.stream import Stream
from astream._format.local import LocalDataset
from astream._storage.registry import register as register_storage
from astream._storage.upload import CSVWriter, JSONWriter, MDSWriter, TSVWriter, XSVWriter
from astream.convert import merge_index
from astream.errors import AstreamError

__version__ = "0.1.0.dev0"

__all__ = [
    "AstreamError",
    "CSVWriter",
    "CoordConfig",
    "JSONWriter",
    "Loader",
    "LocalDataset",
    "MDSWriter",
    "Stats",
    "Stream",
    "StreamingDataset",
    "TSVWriter",
    "World",
    "XSVWriter",
    "__version__",
    "convert",
    "errors",
    "merge_index",
    "register_storage",
]


def _adopt(*objects: object) -> None:
    # Show public classes as astream.X in reprs and docs, not astream._format.writer.X.
    for obj in objects:
        with contextlib.suppress(AttributeError, TypeError):
            obj.__module__ = "astream"


_adopt(
    CSVWriter, CoordConfig, JSONWriter, LocalDataset, Loader, MDSWriter, Stats, Stream, StreamingDataset, TSVWriter,
    World, XSVWriter, register_storage,
)
