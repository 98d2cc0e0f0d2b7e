"""The benchmarks' datasets, built once per shape and size under the data folder.

Every dataset lives at ``<data>/bucket/<name>``, so that one loopback server of ``<data>``
serves it to astream over HTTP (``/bucket/<name>``) and to mosaicml-streaming as a
path-style S3 bucket (``s3://bucket/<name>``). A marker file names what was built; a
folder whose marker differs is built again.
"""

from __future__ import annotations

import io
import json
import os
import shutil
import sys
import tarfile
from pathlib import Path

from astream.cli._harness.work.samples import COLUMNS, sample

__all__ = ["count", "lit", "mds", "parquet", "stored_bytes", "tars"]


def _fresh(out: Path, spec: str) -> bool:
    """True when ``out`` holds what ``spec`` names; else empties it for a build."""
    marker = out / f".built-{spec}"
    if marker.exists():
        return True
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)
    print(f"building {out} ({spec}) ...", file=sys.stderr, flush=True)
    return False


def _done(out: Path, spec: str) -> Path:
    (out / f".built-{spec}").touch()
    return out


def mds(data: Path, name: str, shape: str, samples: int, size_limit: str = "64mb") -> Path:
    """An uncompressed (``zstd``: zstd-compressed) MDS dataset of ``samples`` samples of ``shape``
    (:data:`~astream.cli._harness.work.samples.COLUMNS`)."""
    from astream import MDSWriter

    out = data / "bucket" / name
    spec = f"{shape}-{samples}-{size_limit}-v2"
    if _fresh(out, spec):
        return out
    compression = "zstd" if shape == "zstd" else None
    with MDSWriter(out=str(out), columns=COLUMNS[shape], compression=compression, size_limit=size_limit,
                   exist_ok=True) as writer:
        for i in range(samples):
            writer.write(sample(shape, i))
    return _done(out, spec)


def lit(data: Path, name: str, shape: str, samples: int, python: str) -> Path:
    """The samples of :func:`mds` in LitData's own format (``litdata.optimize`` in its
    interpreter ``python``)."""
    from astream.cli._harness.proc import code_env, run_children

    out = data / "bucket" / name
    spec = f"lit-{shape}-{samples}-v1"
    if _fresh(out, spec):
        return out
    run_children(python, "samples", "lit_convert", {"shape": shape, "count": samples, "out": str(out)},
                 [code_env(dict(os.environ), None, str(data / "pycache"))], str(data), f"litdata.optimize of {name}")
    return _done(out, spec)


def parquet(data: Path, name: str, files: int = 4, groups: int = 8, rows: int = 32768) -> Path:
    """``files`` Parquet files of ``groups`` row groups of ``rows`` rows (``id`` int64, ``x``
    float32, ``label`` int32, ``text`` a short string), with the index ``astream index``
    writes beside them (a web server cannot list)."""
    import numpy as np
    import pyarrow as pa
    import pyarrow.parquet as pq

    from astream.cli import main as cli

    out = data / "bucket" / name
    spec = f"parquet-{files}-{groups}-{rows}-v1"
    if _fresh(out, spec):
        return out
    rng, total = np.random.default_rng(0), 0
    for f in range(files):
        ids = np.arange(total, total + groups * rows)
        table = pa.table({"id": pa.array(ids, pa.int64()), "x": pa.array(rng.random(len(ids), dtype=np.float32)),
                          "label": pa.array((ids % 1000).astype(np.int32)),
                          "text": pa.array([f"row {i} " + "w" * int(i % 40) for i in ids])})
        pq.write_table(table, out / f"part-{f:03d}.parquet", row_group_size=rows)
        total += len(ids)
    if cli(["-q", "index", str(out)]):
        raise RuntimeError(f"astream index {out} failed")
    return _done(out, spec)


def tars(data: Path, name: str, count: int = 8, samples: int = 4000, size: int = 4096) -> Path:
    """``count`` WebDataset tars of ``samples`` samples each: a ``cls`` member and a
    ``size``-byte ``jpg`` member (no decoding on any side), with the index beside them."""
    import numpy as np

    from astream.cli import main as cli

    out = data / "bucket" / name
    spec = f"wds-{count}-{samples}-{size}-v1"
    if _fresh(out, spec):
        return out
    payload = np.random.default_rng(0).integers(0, 256, size, np.uint8).tobytes()
    for t in range(count):
        with tarfile.open(out / f"shard-{t:05d}.tar", "w") as tar:
            for i in range(t * samples, (t + 1) * samples):
                for ext, body in (("cls", str(i % 1000).encode()), ("jpg", payload)):
                    info = tarfile.TarInfo(f"{i:08d}.{ext}")
                    info.size = len(body)
                    tar.addfile(info, io.BytesIO(body))
    if cli(["-q", "index", str(out)]):
        raise RuntimeError(f"astream index {out} failed")
    return _done(out, spec)


def count(folder: Path) -> int:
    """Samples in an MDS dataset, from its index.json."""
    index = json.loads((folder / "index.json").read_text())
    return sum(int(s["samples"]) for s in index["shards"])


def stored_bytes(folder: Path) -> int:
    """Bytes of an MDS dataset's stored shards (what a cold epoch transfers, index.json aside)."""
    index = json.loads((folder / "index.json").read_text())
    return sum(os.path.getsize(folder / (s.get("zip_data") or s["raw_data"])["basename"]) for s in index["shards"])
