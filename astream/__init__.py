"""astream: stream sharded MDS datasets into any Python training loop.

The public names live here; the implementation is in private packages (see DESIGN.md).
"""

from __future__ import annotations

import contextlib
import importlib
from typing import TYPE_CHECKING, Any

from astream import errors
from astream._coord.config import CoordConfig
from astream._coord.world import World
from astream._dataset.dataset import StreamingDataset
from astream._dataset.loader import Loader
from astream._dataset.observe.stats import Stats
from astream._dataset.stream import Stream
from astream._storage.registry import register as register_storage
from astream.errors import AstreamError

if TYPE_CHECKING:
    from astream import convert
    from astream._format.local import LocalDataset
    from astream._storage.upload import CSVWriter, JSONWriter, MDSWriter, TSVWriter, XSVWriter
    from astream.convert import merge_index

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


_adopt(CoordConfig, Loader, Stats, Stream, StreamingDataset, World, register_storage)

# Imported when first used: a program that only reads (a job starting cold) never needs the
# writers, the converters or their progress bars (tqdm), ~10 ms of every fresh process.
_LAZY = {
    "CSVWriter": "astream._storage.upload",
    "JSONWriter": "astream._storage.upload",
    "MDSWriter": "astream._storage.upload",
    "TSVWriter": "astream._storage.upload",
    "XSVWriter": "astream._storage.upload",
    "LocalDataset": "astream._format.local",
    "merge_index": "astream.convert",
}


# MosaicML's names that do not carry over, and what replaces them: `from astream import X`
# (a script whose imports were changed) stops at once with the fix, not "cannot import name".
_REPLACED = {
    "StreamingDataLoader": "use astream.Loader(ds, batch_size=B, num_workers=W), which has "
                           "StreamingDataLoader's state_dict()/load_state_dict() (docs/migration.md)",
}


def __getattr__(name: str) -> Any:
    if name == "convert":
        return importlib.import_module("astream.convert")  # (the import makes it an attribute)
    if name in _REPLACED:
        raise ImportError(f"astream has no {name}: {_REPLACED[name]}", name=name)
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'astream' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    _adopt(value)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted({*globals(), *_LAZY, "convert"})
