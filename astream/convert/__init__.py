"""Distributed conversion to MDS: Spark, Ray Data and Dask from one partition writer.

The neutral core (no engine imported here, ever):

* :func:`write_partition` writes one partition as ``out/part-NNNNN/`` (deterministic
  names: a retried task replaces, never duplicates), uploading each shard as it closes;
* :func:`merge_index` writes the one ``index.json`` over all parts, from the fragments
  the tasks returned (or, for recovery, from what lies in ``out``);
* :func:`arrow_columns` turns an Arrow schema into MDS column encodings.

The engine adapters are imported on first use, each behind its pip extra:
``dataframe_to_mds`` (Spark, MosaicML's signature; ``astream[spark]``), ``MDSDatasink``
(Ray Data, ``astream[ray]``) and :mod:`astream.convert.dask` (``to_mds``, ``astream[dask]``).
``astream.convert.spark.files_to_mds`` converts files or a bucket on Spark with the tasks
reading them through astream's storage (:mod:`astream.convert.files`; no connector jars).
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from astream.convert._merge import merge_index
from astream.convert._part import PartFragment, write_partition
from astream.convert._types import TYPE_TABLE, arrow_columns

if TYPE_CHECKING:  # pragma: no cover
    from astream.convert.ray import MDSDatasink
    from astream.convert.spark import dataframe_to_mds

__all__ = [
    "TYPE_TABLE",
    "MDSDatasink",
    "PartFragment",
    "arrow_columns",
    "dataframe_to_mds",
    "merge_index",
    "write_partition",
]

_LAZY = {"dataframe_to_mds": "astream.convert.spark", "MDSDatasink": "astream.convert.ray"}


def __getattr__(name: str) -> Any:
    module = _LAZY.get(name)
    if module is None:
        raise AttributeError(f"module 'astream.convert' has no attribute {name!r}")
    import importlib

    value = getattr(importlib.import_module(module), name)
    globals()[name] = value
    return value


for _name in ("merge_index", "PartFragment", "write_partition", "arrow_columns"):
    globals()[_name].__module__ = __name__
del _name
