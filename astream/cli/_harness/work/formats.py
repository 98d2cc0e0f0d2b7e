"""Workloads over Parquet folders and WebDataset tars: astream's ``format=`` streaming, the
peers' own readers (Hugging Face ``datasets``, LitData's Parquet loader, ``webdataset``) and
pyarrow's reader as the floor. Each runs in a fresh process; ``repeats`` passes in it."""

from __future__ import annotations

import os
import shutil
import time
from typing import Any

__all__ = ["parquet", "webdataset"]

PARQUET_BATCH = 256
WDS_BATCH = 256


def _files(remote: str, suffix: str = ".parquet") -> list[str]:
    """A folder's files of ``suffix`` (for a URL, those the index beside them lists, as
    ``astream index`` wrote it: a web server cannot list)."""
    if "://" not in remote:
        return sorted(os.path.join(remote, n) for n in os.listdir(remote) if n.endswith(suffix))
    import json
    import urllib.request

    index = "index.parquet.json" if suffix == ".parquet" else "index.wds.json"
    with urllib.request.urlopen(f"{remote}/{index}") as resp:
        return sorted(f"{remote}/{f['name']}" for f in json.load(resp)["files"])


def _astream(remote: str, cache: str, what: str, total: int, fmt: str, batch: int) -> dict[str, float]:
    from astream import Loader, StreamingDataset

    start = time.perf_counter()
    ds = StreamingDataset(remote=remote, local=cache, format=fmt, batch_size=batch)
    loader = Loader(ds, num_workers=0, drop_last=False)
    try:
        if what == "resume":
            at = int(0.9 * total)
            state = {**loader.state_dict(), "sample_in_epoch": at}
            loaded = time.perf_counter()
            loader.load_state_dict(state)
            first, ids = None, None
            for b in loader:
                if first is None:
                    first, ids = time.perf_counter(), b["id"]
            end = time.perf_counter()
            assert first is not None
            assert ids is not None
            if int(ids[0]) != at:
                raise AssertionError(f"resumed at row {int(ids[0])}, not {at}")
            return {"resume_s": first - start, "from_state_s": first - loaded, "rest_s": end - loaded}
        if what == "warm":
            for _ in loader:
                pass
            start = time.perf_counter()
        rows, first_s = 0, 0.0
        for b in loader:
            if not rows:
                first_s = time.perf_counter() - start
            rows += len(next(iter(b.values())))
        if total >= 0 and rows != total:
            raise AssertionError(f"{rows} rows, not {total}")
        return {"rows_per_s": rows / (time.perf_counter() - start), "first_s": first_s}
    finally:
        loader.close()
        ds.close()


def _pyarrow(remote: str) -> dict[str, float]:
    """The floor: pyarrow's ``iter_batches`` over every file in order, each record batch
    turned into NumPy arrays (numbers) and lists (strings), as astream's batches come out."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    start, rows = time.perf_counter(), 0
    for path in _files(remote):
        for rb in pq.ParquetFile(path).iter_batches(batch_size=PARQUET_BATCH):
            batch = {n: c.to_pylist() if pa.types.is_string(c.type) else c.to_numpy()
                     for n, c in zip(rb.schema.names, rb.columns, strict=True)}
            rows += len(next(iter(batch.values())))
    return {"rows_per_s": rows / (time.perf_counter() - start)}


def _hf(remote: str, what: str, total: int) -> dict[str, float]:
    """Hugging Face ``datasets`` streaming (``load_dataset("parquet", streaming=True)``; a URL
    through its fsspec HTTP file system, which needs aiohttp in that interpreter)."""
    import numpy as np
    from datasets import load_dataset

    files = _files(remote)

    def make() -> Any:
        return load_dataset("parquet", data_files=files, split="train", streaming=True).batch(PARQUET_BATCH)

    if what != "resume":
        start, rows, first_s = time.perf_counter(), 0, 0.0
        for b in make():
            out = {k: (v if isinstance(v[0], str) else np.asarray(v)) for k, v in b.items()}
            if not rows:
                first_s = time.perf_counter() - start
            rows += len(next(iter(out.values())))
        return {"rows_per_s": rows / (time.perf_counter() - start), "first_s": first_s}
    it, seen, state, at = make(), 0, None, 0
    for b in it:  # the state at 90% of the epoch, as a checkpoint would hold it
        seen += len(b["id"])
        if state is None and seen >= 0.9 * total:
            state, at = it.state_dict(), seen
    start = time.perf_counter()
    again = make()
    loaded = time.perf_counter()
    again.load_state_dict(state)
    batches = iter(again)
    b = next(batches)
    first = time.perf_counter()  # the first batch in hand: closing the iteration comes after
    return {"resume_s": first - start, "from_state_s": first - loaded, "wrong": float(int(b["id"][0]) != at)}


def _litdata(remote: str, cache: str, what: str, total: int) -> dict[str, float]:
    """LitData's Parquet streaming (``index_parquet_dataset`` then ``ParquetLoader``) over hard
    links of the files in a folder of its own (it writes its index.json there)."""
    import torch
    from litdata import StreamingDataLoader, StreamingDataset, index_parquet_dataset
    from litdata.streaming.item_loader import ParquetLoader

    data = os.path.join(cache, "lit-data")
    os.makedirs(data, exist_ok=True)
    for path in _files(remote):
        os.link(path, os.path.join(data, os.path.basename(path)))
    index_parquet_dataset(data)

    def make() -> Any:
        ds = StreamingDataset(data, item_loader=ParquetLoader(), cache_dir=os.path.join(cache, "lit-cache"))
        return StreamingDataLoader(ds, batch_size=PARQUET_BATCH, num_workers=0)

    def ids(b: dict[str, Any]) -> Any:
        v = b["id"]
        return v.numpy() if isinstance(v, torch.Tensor) else v

    start = time.perf_counter()
    loader, rows, first_s, state, at = make(), 0, 0.0, None, 0
    for b in loader:
        if not rows:
            first_s = time.perf_counter() - start
        rows += len(ids(b))
        if state is None and rows >= 0.9 * total:
            state, at = loader.state_dict(), rows
    cold = rows / (time.perf_counter() - start)
    if what == "resume":
        start = time.perf_counter()
        again = make()
        loaded = time.perf_counter()
        again.load_state_dict(state)
        b = next(iter(again))
        first = time.perf_counter()  # (resumed elsewhere than its state: counted, as HF's)
        return {"resume_s": first - start, "from_state_s": first - loaded, "wrong": float(int(ids(b)[0]) != at)}
    if what == "warm":
        start = time.perf_counter()
        warm_rows = sum(len(ids(b)) for b in loader)
        return {"rows_per_s": warm_rows / (time.perf_counter() - start)}
    return {"rows_per_s": cold, "first_s": first_s}


def parquet(lib: str, remote: str, cache: str, what: str, total: int, repeats: int = 1) -> dict[str, Any]:
    """``repeats`` passes (``what``: ``cold``, ``warm``) or resumptions at 90% (``resume``) of a
    Parquet folder or its loopback URL, by ``lib`` (astream, pyarrow, hf, litdata), each from
    a fresh cache under ``cache``; every figure listed per repeat. ``total``: the rows a pass
    must count (-1: not checked); a resumption checks it starts at the ``id`` it asked for."""
    t0 = time.perf_counter()
    runs: list[dict[str, float]] = []
    # A resumption of astream is timed after one untimed (its lazy imports done), as the peers'
    # are: each resumes in the process that iterated the epoch the state was taken from.
    warm_up = int(lib == "astream" and what == "resume")
    for i in range(-warm_up, repeats):
        fresh = os.path.join(cache, f"r{i}")
        os.makedirs(fresh)
        if lib == "astream":
            runs.append(_astream(remote, fresh, what, total, "parquet", PARQUET_BATCH))
        elif lib == "pyarrow":
            runs.append(_pyarrow(remote))
        elif lib == "hf":
            runs.append(_hf(remote, what, total))
        else:
            runs.append(_litdata(remote, fresh, what, total))
        shutil.rmtree(fresh, ignore_errors=True)  # (an agent may still be finishing a write)
        if i < 0:
            runs.pop()
    return {"wall_s": time.perf_counter() - t0, **{k: [r[k] for r in runs] for k in runs[0]}}


def webdataset(lib: str, remote: str, cache: str, what: str, total: int, repeats: int = 1) -> dict[str, Any]:
    """``repeats`` passes over WebDataset tars: astream's ``format="webdataset"`` (``cold``: a
    fresh cache; ``warm``: a second epoch) or the ``webdataset`` package's pipeline over the
    tars (paths, or the loopback server's URLs, which it streams through ``curl``)."""
    rates: list[float] = []
    for i in range(repeats):
        fresh = os.path.join(cache, f"r{i}")
        os.makedirs(fresh)
        if lib == "astream":
            rates.append(_astream(remote, fresh, what, total, "webdataset", WDS_BATCH)["rows_per_s"])
        else:
            import webdataset as wds

            start, n = time.perf_counter(), 0
            for batch in wds.WebDataset(_files(remote, ".tar"), shardshuffle=False).batched(WDS_BATCH, partial=True):
                n += len(batch["__key__"])
            if total >= 0 and n != total:
                raise AssertionError(f"{n} samples, not {total}")
            rates.append(n / (time.perf_counter() - start))
        shutil.rmtree(fresh, ignore_errors=True)
    return {"rows_per_s": rates}
