"""A merged distributed conversion read back by mosaicml-streaming (skipped when it is absent)."""

from __future__ import annotations

import importlib.util
import sys
import types
import warnings
from pathlib import Path
from typing import Any

import pytest

from astream.convert import merge_index, write_partition

from .convertkit import check_samples, table

pytestmark = [pytest.mark.peer, pytest.mark.filterwarnings("ignore")]


def _streaming() -> Any:
    if importlib.util.find_spec("streaming") is None:
        pytest.skip("mosaicml-streaming is not installed")
    stub = types.ModuleType("streaming.vision")
    stub.__path__ = []
    sys.modules.setdefault("streaming.vision", stub)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        import streaming
    return streaming


@pytest.mark.parametrize("compression", [None, "zstd"])
def test_mosaicml_reads_the_merged_parts(tmp_path: Path, compression: str | None) -> None:
    streaming = _streaming()
    out = str(tmp_path / "ds")
    fragments = [write_partition(table(12, 12 * k), out, k, size_limit=1500, compression=compression)
                 for k in (2, 0, 1)]
    merge_index(fragments)
    if compression is None:  # its LocalDataset reads uncompressed shards only
        local = streaming.LocalDataset(local=out)
        check_samples((local[i] for i in range(len(local))), 36)
    remote = streaming.StreamingDataset(remote=out, local=str(tmp_path / "cache"), batch_size=4, shuffle=False)
    check_samples((remote[i] for i in range(len(remote))), 36)


def test_mosaicml_reads_records_written_in_bulk(tmp_path: Path) -> None:
    """Plain columns take the bulk path (records built from the Arrow buffers)."""
    import numpy as np
    import pyarrow as pa

    streaming = _streaming()
    n = 40
    data = pa.table({
        "id": pa.array(np.arange(n), pa.int64()), "label": pa.array(np.arange(n) % 7, pa.int32()),
        "text": [f"row {i} " + "é" * (i % 5) for i in range(n)], "blob": [bytes([i]) * (i % 3) for i in range(n)],
        "mat": pa.FixedSizeListArray.from_arrays(pa.array(np.arange(n * 4, dtype=np.float32)), 4),
    })
    out = str(tmp_path / "ds")
    merge_index([write_partition(data.to_batches(max_chunksize=16), out, 0, size_limit=700, compression="zstd")])
    ds = streaming.StreamingDataset(remote=out, local=str(tmp_path / "cache"), batch_size=4, shuffle=False)
    got = sorted((ds[i] for i in range(len(ds))), key=lambda s: int(s["id"]))
    assert [int(s["id"]) for s in got] == list(range(n))
    for i, s in enumerate(got):
        assert (int(s["label"]), s["text"], s["blob"]) == (i % 7, f"row {i} " + "é" * (i % 5), bytes([i]) * (i % 3))
        np.testing.assert_array_equal(s["mat"], np.arange(4 * i, 4 * i + 4, dtype=np.float32))
