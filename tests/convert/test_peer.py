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
