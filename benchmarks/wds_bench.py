"""Streaming WebDataset tars: astream's ``format="webdataset"`` against the ``webdataset``
package's own pipeline, same tars.

Writes ``--tars`` tars of ``--samples`` samples (a ``cls`` member and a ``--bytes``-byte
``jpg`` member each, no decoding on either side) and reads them:

- ``webdataset``: ``webdataset.WebDataset(paths, shardshuffle=False).batched(256)``, in a
  subprocess of ``--wds-python`` (an interpreter with the ``webdataset`` package; it is not
  a dependency of astream), samples per second over the whole pass;
- ``astream warm``: ``StreamingDataset(format="webdataset")`` + ``Loader(num_workers=0)``,
  batch 256, no shuffle, every tar already cached (a second epoch);
- ``astream cold``: the same from a fresh cache, the tars fetched from the local folder
  (the index built by scanning each tar's headers in place).

With ``--http`` both read from a loopback HTTP server instead: ``webdataset`` the tars' URLs
(it streams each through ``curl``), astream the server with the index ``astream index``
wrote next to the tars (a web server cannot list), each tar fetched once into the cache.

Medians of ``--runs`` alternated runs.

    python benchmarks/wds_bench.py --wds-python "$VENV/bin/python"
    python benchmarks/wds_bench.py --wds-python "$VENV/bin/python" --http
"""

from __future__ import annotations

import argparse
import io
import json
import shutil
import statistics
import subprocess
import tarfile
import tempfile
import time
from pathlib import Path

import numpy as np

from astream import Loader, StreamingDataset
from astream.cli import main as cli
from astream.testing import LoopbackServer

BATCH = 256

_WDS = """
import json, sys, time
import webdataset as wds
t0 = time.perf_counter()
n = 0
for batch in wds.WebDataset(sys.argv[1:], shardshuffle=False).batched(BATCH, partial=True):
    n += len(batch["__key__"])
print(json.dumps({"seconds": time.perf_counter() - t0, "samples": n}))
""".replace("BATCH", str(BATCH))


def write(root: Path, tars: int, samples: int, size: int) -> int:
    rng = np.random.default_rng(0)
    payload = rng.integers(0, 256, size, np.uint8).tobytes()
    for t in range(tars):
        with tarfile.open(root / f"shard-{t:05d}.tar", "w") as tar:
            for i in range(t * samples, (t + 1) * samples):
                for ext, data in (("cls", str(i % 1000).encode()), ("jpg", payload)):
                    info = tarfile.TarInfo(f"{i:08d}.{ext}")
                    info.size = len(data)
                    tar.addfile(info, io.BytesIO(data))
    return tars * samples


def wds_pass(python: str, root: Path, url: str | None) -> tuple[float, int]:
    paths = [f"{url}/{p.name}" if url else str(p) for p in sorted(root.glob("*.tar"))]
    out = subprocess.run([python, "-c", _WDS, *paths], check=True, capture_output=True, text=True).stdout
    got = json.loads(out.strip().splitlines()[-1])
    return got["seconds"], got["samples"]


def astream_pass(remote: str, cache: Path, epochs: int) -> tuple[float, int]:
    start = time.perf_counter()
    ds = StreamingDataset(remote=remote, local=str(cache), format="webdataset", batch_size=BATCH)
    loader = Loader(ds, num_workers=0, drop_last=False)
    try:
        for _ in range(epochs - 1):
            for _ in loader:
                pass
            start = time.perf_counter()
        n = sum(len(b["__key__"]) for b in loader)
        return time.perf_counter() - start, n
    finally:
        loader.close()
        ds.close()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tars", type=int, default=8)
    parser.add_argument("--samples", type=int, default=4000)
    parser.add_argument("--bytes", type=int, default=4096)
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--wds-python", help="an interpreter with the webdataset package")
    parser.add_argument("--http", action="store_true", help="both read from a loopback HTTP server")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="wds-bench-"))
    data = work / "data"
    data.mkdir()
    total = write(data, args.tars, args.samples, args.bytes)
    size = sum(p.stat().st_size for p in data.glob("*.tar"))
    print(f"{args.tars} tars x {args.samples} samples = {total} samples, {size / 1e6:.1f} MB")
    results: dict[str, list[float]] = {"warm": [], "cold": []}
    if args.wds_python:
        results["webdataset"] = []
    server = None
    try:
        remote, url = str(data), None
        if args.http:
            cli(["-q", "index", str(data)])
            server = LoopbackServer(str(data)).__enter__()
            remote = url = server.url
        for run in range(args.runs):
            cache = work / f"cache-{run}"
            for kind, epochs in (("cold", 1), ("warm", 2)):
                shutil.rmtree(cache, ignore_errors=True)
                seconds, n = astream_pass(remote, cache, epochs)
                assert n == total
                results[kind].append(n / seconds)
            if args.wds_python:
                seconds, n = wds_pass(args.wds_python, data, url)
                assert n == total
                results["webdataset"].append(n / seconds)
            print(f"run {run}: " + ", ".join(f"{k} {v[-1]:,.0f} samples/s" for k, v in results.items()))
    finally:
        if server is not None:
            server.__exit__(None, None, None)
        shutil.rmtree(work, ignore_errors=True)
    med = {k: statistics.median(v) for k, v in results.items()}
    print("medians: " + ", ".join(f"{k} {v:,.0f} samples/s" for k, v in med.items()))
    if "webdataset" in med:
        print(f"astream warm / webdataset = {med['warm'] / med['webdataset']:.2f}x, "
              f"cold / webdataset = {med['cold'] / med['webdataset']:.2f}x")


if __name__ == "__main__":
    main()
