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
URLs are read by the engine's own file systems: pyarrow's S3 for Ray, s3fs for Dask (in the
``dask`` extra), Spark's ``s3a://`` only with the hadoop-aws jars (``spark.jars.packages``);
``S3_ENDPOINT_URL`` (the variable astream's own S3 backend and MosaicML Streaming read) names
the endpoint of an S3-compatible store for Ray and Dask, whose readers would otherwise look
at ``AWS_ENDPOINT_URL`` only. Dask's images are listed and read through astream's storage, a
partition per file; for Spark without connector jars, :func:`astream.convert.spark.files_to_mds`
has its tasks read the files through astream's storage (``astream convert --engine spark``
does so for remote inputs).
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import Any

from astream.errors import ConfigError, MissingExtraError

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

        if fmt == "image":
            return _dask_images(paths)
        options = _fsspec_options(paths)
        if fmt == "parquet":
            return dd.read_parquet(paths, dtype_backend="pyarrow", **options)
        return dd.read_json(paths, lines=True, blocksize=None, **options)
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


def _fsspec_options(paths: list[str]) -> dict[str, Any]:
    """Dask's ``storage_options`` for ``s3://`` inputs: s3fs, at ``S3_ENDPOINT_URL`` when set.

    Raises:
        MissingExtraError: an ``s3://`` input without s3fs installed.
    """
    if not any(p.startswith("s3://") for p in paths):
        return {}
    try:
        import s3fs  # noqa: F401
    except ImportError as exc:
        raise MissingExtraError("reading s3:// inputs on Dask", "dask", "s3fs") from exc
    endpoint = os.environ.get("S3_ENDPOINT_URL")
    return {"storage_options": {"client_kwargs": {"endpoint_url": endpoint}}} if endpoint else {}


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


def _read_images(inputs: Any, group: int) -> Any:
    batches = list(inputs.batches(group))
    return _image_frame([p for b in batches for p in b.column("path").to_pylist()],
                        [i for b in batches for i in b.column("image").to_pylist()])


def _dask_images(paths: list[str]) -> Any:
    """One partition per image file, read by the task through astream's storage (folders or buckets)."""
    import dask.dataframe as dd
    from dask.delayed import delayed

    from astream.convert.files import FileInputs

    inputs = FileInputs.plan(paths, "image", target_bytes=1)  # a file per partition
    return dd.from_delayed([delayed(_read_images)(inputs, k) for k in range(len(inputs.groups))],
                           meta=_image_frame([], []))
