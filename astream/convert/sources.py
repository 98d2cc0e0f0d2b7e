"""Inputs beyond data frames: a folder or bucket of Parquet, JSONL or image files, read by the engine.

``read_files(engine, paths, fmt, session)`` returns the engine's own dataset of the files,
read by the engine's workers (the driver only lists nothing and reads nothing):

========  ===========================  =============================  ==========================
format    Spark                        Ray Data                       Dask
========  ===========================  =============================  ==========================
parquet   ``spark.read.parquet``       ``ray.data.read_parquet``      ``dd.read_parquet``
jsonl     ``spark.read.json``          ``ray.data.read_json``         ``dd.read_json(lines=True)``
image     ``binaryFile`` data source   ``ray.data.read_binary_files`` one partition per file
========  ===========================  =============================  ==========================

Images come as two columns, ``path`` (str) and ``image`` (the file's bytes, stored as
``bytes``; give ``columns={"image": "jpeg"}`` or ``"pil"`` to have them decoded). Remote
URLs (``s3://...``) are read by the engine's own file systems (Spark's ``s3a://`` with
hadoop-aws, pyarrow's S3 for Ray, s3fs for Dask). For Ray, ``S3_ENDPOINT_URL`` (the variable
astream's own S3 backend and MosaicML Streaming read) names the endpoint of an
S3-compatible store; pyarrow alone would only look at ``AWS_ENDPOINT_URL``.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from astream.errors import ConfigError

__all__ = ["ENGINE_FORMATS", "IMAGE_EXTENSIONS", "read_files"]

ENGINE_FORMATS = ("parquet", "jsonl", "image")
IMAGE_EXTENSIONS = (".jpg", ".jpeg", ".png", ".webp", ".bmp", ".gif", ".tif", ".tiff")


def _image_files(paths: Sequence[str]) -> list[str]:
    files: list[str] = []
    for path in paths:
        if os.path.isdir(path):
            files += sorted(os.path.join(path, f) for f in os.listdir(path)
                            if os.path.splitext(f)[1].lower() in IMAGE_EXTENSIONS)
        else:
            files.append(path)
    return files


def read_files(engine: str, paths: Sequence[str], fmt: str, session: Any = None) -> Any:
    """The engine's dataset of the files at ``paths`` (folders, files or URLs).

    Args:
        engine: ``spark``, ``ray`` or ``dask``.
        paths: the inputs.
        fmt: ``parquet``, ``jsonl`` or ``image``.
        session: the SparkSession (Spark only).

    Raises:
        ConfigError: an unknown engine or format.
    """
    paths = [os.fspath(p) for p in paths]
    if fmt not in ENGINE_FORMATS:
        raise ConfigError(f"format {fmt!r}: the engines read {', '.join(ENGINE_FORMATS)}")
    if engine == "spark":
        if session is None:
            raise ConfigError("read_files('spark', ...) needs the SparkSession")
        if fmt == "parquet":
            return session.read.parquet(*paths)
        if fmt == "jsonl":
            return session.read.json(paths)
        frame = session.read.format("binaryFile").option("pathGlobFilter", "*.*").load(paths)
        return frame.selectExpr("path", "content AS image")
    if engine == "ray":
        import ray.data

        fs: dict[str, Any] = {}
        if fmt != "image":
            paths, fs = _arrow_s3(paths)
        if fmt == "parquet":
            return ray.data.read_parquet(paths, **fs)
        if fmt == "jsonl":
            return ray.data.read_json(paths, lines=True, **fs) if _takes_lines() else ray.data.read_json(paths, **fs)
        data = ray.data.read_binary_files(_image_files(paths), include_paths=True)
        return data.rename_columns({"bytes": "image"})
    if engine == "dask":
        import dask.dataframe as dd

        if fmt == "parquet":
            return dd.read_parquet(paths, dtype_backend="pyarrow")
        if fmt == "jsonl":
            return dd.read_json(paths, lines=True, blocksize=None)
        return _dask_images(_image_files(paths))
    raise ConfigError(f"engine {engine!r}: use spark, ray or dask")


def _arrow_s3(paths: list[str]) -> tuple[list[str], dict[str, Any]]:
    """``s3://`` inputs with ``S3_ENDPOINT_URL`` set: pyarrow's S3 file system pointed at it.

    Returns the paths (without the scheme when a file system is given) and the keyword
    arguments for Ray's readers. The file system travels to the read tasks pickled.
    """
    endpoint = os.environ.get("S3_ENDPOINT_URL")
    if not endpoint or not paths or not all(p.startswith("s3://") for p in paths):
        return paths, {}
    from pyarrow import fs

    region = os.environ.get("AWS_REGION") or os.environ.get("AWS_DEFAULT_REGION") or "us-east-1"
    scheme = "https" if endpoint.startswith("https://") else "http"
    store = fs.S3FileSystem(endpoint_override=endpoint, scheme=scheme, region=region)
    return [p[len("s3://"):] for p in paths], {"filesystem": store}


def _takes_lines() -> bool:
    import inspect

    import ray.data

    return "lines" in inspect.signature(ray.data.read_json).parameters


def _image_frame(paths: list[str], images: list[bytes]) -> Any:
    # Arrow-typed columns: Dask would otherwise turn an object column of bytes into text.
    import pandas as pd
    import pyarrow as pa

    return pd.DataFrame({"path": pd.Series(paths, dtype=pd.ArrowDtype(pa.string())),
                         "image": pd.Series(images, dtype=pd.ArrowDtype(pa.binary()))})


def _read_image(path: str) -> Any:
    with open(path, "rb") as fh:
        return _image_frame([path], [fh.read()])


def _dask_images(files: list[str]) -> Any:
    import dask.dataframe as dd
    from dask.delayed import delayed

    if not files:
        raise ConfigError("no image files found in the inputs")
    return dd.from_delayed([delayed(_read_image)(f) for f in files], meta=_image_frame([], []))
