"""The samples of the benchmarks' datasets, one pure function of (shape, index).

Written by astream's ``MDSWriter`` in the driver, and by ``litdata.optimize`` in LitData's
interpreter (:func:`lit_convert`): the same samples for every library.
"""

from __future__ import annotations

import os
from typing import Any

__all__ = ["COLUMNS", "lit_convert", "sample"]

WORDS = ("alpha", "beta", "gamma", "delta", "epsilon", "zeta")
# shape -> MDS columns. records: the "many small records" case (~1 KB); arrays: ~100 KB
# float32 arrays; zstd: compressible 4 KB records (small integers compress ~3-4x, as token
# or label arrays do), stored zstd.
COLUMNS = {
    "records": {"id": "int", "name": "str", "payload": "bytes"},
    "arrays": {"id": "int", "x": "ndarray:float32:25600"},
    "zstd": {"id": "int", "x": "ndarray:uint8:4096"},
    "fixed": {"id": "int", "score": "float32", "feat": "ndarray:uint8:256"},  # all fixed-size: get_batch vectorises
    "blobs": {"id": "int64", "x": "bytes"},  # 2 KB of random bytes: the forecast's small shards
    "images": {"x": "ndarray:uint8:3,32,32", "y": "int64"},  # an image classifier's batches, for the adapters
}


def sample(shape: str, i: int) -> dict[str, Any]:
    """Sample ``i`` of a dataset of ``shape``."""
    import numpy as np

    if shape == "records":
        return {"id": i, "name": " ".join(WORDS[(i + k) % 6] for k in range(3)),
                "payload": np.random.default_rng(i).bytes(900)}
    if shape == "arrays":
        return {"id": i, "x": np.full(25600, i % 1000, np.float32)}
    if shape == "blobs":
        return {"id": i, "x": np.random.default_rng(i).bytes(2048)}
    if shape == "images":
        return {"x": np.random.default_rng(i).integers(0, 255, (3, 32, 32), dtype=np.uint8), "y": i % 10}
    if shape == "fixed":
        return {"id": i, "score": i / 3, "feat": np.full(256, i % 251, np.uint8)}
    return {"id": i, "x": np.random.default_rng(i).integers(0, 16, 4096, dtype=np.uint8)}


def _lit_sample(i: int) -> dict[str, Any]:
    return sample(os.environ["ASTREAM_BENCH_SHAPE"], i)  # (LitData's workers inherit the environment)


def lit_convert(shape: str, count: int, out: str) -> dict[str, Any]:
    """The same samples in LitData's own format (``litdata.optimize``, 32 MB chunks)."""
    import shutil
    import sys
    import tempfile

    import litdata

    # Its workers are spawned and unpickle ``_lit_sample`` by its module's name: a folder
    # on the path (which spawned processes inherit) where this package has that name.
    alias = tempfile.mkdtemp(prefix="bench-work-")
    os.symlink(os.path.dirname(os.path.abspath(__file__)), os.path.join(alias, __name__.split(".")[0]))
    sys.path.insert(0, alias)
    os.environ["ASTREAM_BENCH_SHAPE"] = shape
    try:
        litdata.optimize(fn=_lit_sample, inputs=list(range(count)), output_dir=out, chunk_bytes="32MB",
                         num_workers=1)
    finally:
        sys.path.remove(alias)
        shutil.rmtree(alias, ignore_errors=True)
    if not any(n.endswith(".bin") for n in os.listdir(out)):
        raise RuntimeError(f"litdata.optimize wrote no chunk into {out}")
    return {}
