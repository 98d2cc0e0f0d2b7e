"""``astream convert --engine``: Parquet and image folders converted on Dask and Spark."""

from __future__ import annotations

import io
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from astream import LocalDataset
from astream.cli import main

from .conftest import ROWS
from .convertkit import check_samples

pytestmark = [pytest.mark.slow, pytest.mark.filterwarnings("ignore::DeprecationWarning"),
              pytest.mark.filterwarnings("ignore::ResourceWarning"), pytest.mark.filterwarnings("ignore::UserWarning"),
              pytest.mark.filterwarnings("ignore::FutureWarning")]


def _images(folder: Path, n: int) -> list[bytes]:
    from PIL import Image

    folder.mkdir()
    files = []
    for i in range(n):
        out = io.BytesIO()
        Image.fromarray(np.full((4, 5, 3), i * 20, np.uint8)).save(out, format="PNG")
        (folder / f"img{i}.png").write_bytes(out.getvalue())
        files.append(out.getvalue())
    return files


def test_dask_engine_parquet_and_images(parquet_dir: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    pytest.importorskip("distributed")
    out = tmp_path / "ds"
    assert main(["convert", str(parquet_dir), "-o", str(out), "--engine", "dask", "--workers", "2",
                 "--compression", "zstd", "--size-limit", "4kb"]) == 0
    assert f"wrote {ROWS} samples" in capsys.readouterr().out
    check_samples(iter(LocalDataset(str(out))), ROWS)
    assert main(["convert", str(parquet_dir), "-o", str(out), "--engine", "dask"]) == 2  # not empty
    pngs = _images(tmp_path / "imgs", 3)
    assert main(["convert", str(tmp_path / "imgs"), "-o", str(tmp_path / "img-ds"), "--engine", "dask",
                 "--workers", "1", "-q"]) == 0
    ds = LocalDataset(str(tmp_path / "img-ds"))
    assert sorted(s["image"] for s in ds) == sorted(pngs)
    assert main(["convert", str(tmp_path / "imgs"), "-o", str(tmp_path / "x"), "--format", "image"]) == 2


def test_spark_engine_decodes_images_on_request(spark: Any, tmp_path: Path) -> None:
    _images(tmp_path / "imgs", 4)
    out = tmp_path / "ds"
    assert main(["convert", str(tmp_path / "imgs"), "-o", str(out), "--engine", "spark", "-q",
                 "--columns", "image:pil"]) == 0
    ds = LocalDataset(str(out))
    assert sorted(int(np.asarray(s["image"])[0, 0, 0]) for s in ds) == [0, 20, 40, 60]
    assert all(s["path"].endswith(".png") for s in ds)


def test_local_engine_takes_the_same_arrow_types(tmp_path: Path) -> None:
    import pyarrow.parquet as pq

    from .convertkit import table

    source = tmp_path / "in"
    source.mkdir()
    pq.write_table(table(40).drop_columns(["meta"]), source / "a.parquet", row_group_size=16)
    assert main(["convert", str(source), "-o", str(tmp_path / "ds"), "-q", "--workers", "2", "--parts", "2"]) == 0
    ds = LocalDataset(str(tmp_path / "ds"))
    check_samples(iter(ds), 40, skip=("meta",))
    encodings = dict(zip(ds.index.shards[0].column_names, ds.index.shards[0].column_encodings, strict=True))
    assert encodings["mat"] == "ndarray:int32:2,3"
    assert encodings["when"] == "int64"
