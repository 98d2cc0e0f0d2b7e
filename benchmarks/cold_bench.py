"""Cold-start benchmark: a fresh process, an empty cache, shards behind loopback HTTP.

What a job waits on after every restart on a fresh machine. For each dataset it runs, in
a fresh process each time and interleaved (``--runs`` rounds):

- ``astream``: ``Loader(StreamingDataset(remote="http://127.0.0.1:PORT/bucket/<name>"),
  batch_size=32)`` over an empty cache, one epoch;
- ``mosaic``: mosaicml-streaming's ``StreamingDataset`` + torch ``DataLoader`` over
  ``s3://bucket/<name>`` with ``S3_ENDPOINT_URL`` at the same server (botocore sends plain
  GET/HEAD/Range requests to it), one epoch;
- ``raw``: aiohttp alone copies the same files to disk, 4 at a time (the transfer floor);
- ``astream-resume`` / ``mosaic-resume``: a state dict at 90 % of the epoch loaded into a
  fresh process over an empty cache: the time to the first batch;
- ``warm``: astream iterating the dataset directory itself (no remote): the iteration floor;
- ``astream-pause`` / ``base-pause``: as ``astream``, with a pause of ``--pause`` seconds
  between making the ``Loader`` and iterating it (the program building its model): the
  first batch counts from the end of the pause;
- ``base`` / ``base-resume``: as ``astream``, with the astream package found under
  ``--base`` (another checkout: a before/after in the same run, under the same load);
- ``ranks`` / ``ranks-nofirst``: ``--ranks`` processes of one node (``RANK``/``WORLD_SIZE``/
  ``LOCAL_RANK``/``LOCAL_WORLD_SIZE``, as a launcher sets them), one cache, each reading its
  share of one epoch as ``astream`` does; the node agent runs in its own process. Each
  rank's first batch is what a synchronous data-parallel step waits for (the slowest one).
  ``ranks-nofirst`` is the same with the node's first-shards-first ordering switched off
  (every request sent as a later shard's), to show what that ordering buys.

Times count from the process's start of work, imports included (``import_s`` says how
much of it they are). The peak RSS is summed over the process tree (``/proc``, every 20 ms).

Datasets (built once under ``--data``, default ``$ASTREAM_BENCH_DATA/cold``):

- ``small``: ~50 MB of ~1 KB samples (``id``, ``name``, ``payload`` 900 bytes), 32 MB shards (2);
- ``large``: ~100 MB of 100 KB float32 arrays, 32 MB shards (4);
- ``zstd``: ``--zstd-mb`` (default 500) MB of compressible 4 KB records stored zstd, 64 MB shards.

The floor of a case is ``max(transfer, decompression CPU, warm iteration) + aiohttp import``:
the transfer from ``raw`` (its import taken out), the decompression CPU single-threaded in
this process (zstd only), the warm iteration from ``warm`` (imports taken out). The floor
of the first batch is ``raw``'s time to import aiohttp, fetch index.json and make one
ranged read of the first shard's offset table and first batch. astream's ratios count
from after ``import astream`` (numpy and the package itself are no part of the cold path;
aiohttp, which astream imports lazily, is on both sides).

Usage::

    ASTREAM_PEER_PYTHON=.../peer-venv/bin/python python benchmarks/cold_bench.py --runs 3
    python benchmarks/cold_bench.py --runs 1 --only small --modes astream raw warm --profile
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from loader_bench import child_env, measured_child
from peer_stub import stub_streaming_vision

PEER_PYTHON = os.environ.get("ASTREAM_PEER_PYTHON", sys.executable)
BENCH_DATA = Path(os.environ.get("ASTREAM_BENCH_DATA", Path(tempfile.gettempdir()) / "astream-bench"))
BATCH = 32
DATASETS = ("small", "large", "zstd")
MODES = ("astream", "mosaic", "raw", "astream-resume", "mosaic-resume", "warm", "base", "base-resume",
         "astream-pause", "base-pause", "ranks", "ranks-nofirst")
RANK_MODES = ("ranks", "ranks-nofirst")
RESUME_AT = 0.9


# -- datasets ----------------------------------------------------------------------------------
def build_datasets(root: Path, names: list[str], zstd_mb: int) -> None:
    import numpy as np

    from astream import MDSWriter

    words = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta"]
    for name in names:
        out = root / "bucket" / name
        marker = out / f".built-v1-{zstd_mb if name == 'zstd' else 0}"
        if marker.exists():
            continue
        shutil.rmtree(out, ignore_errors=True)
        out.parent.mkdir(parents=True, exist_ok=True)
        rng = np.random.default_rng(7)
        print(f"building {out} ...", file=sys.stderr, flush=True)
        if name == "small":
            with MDSWriter(out=str(out), columns={"id": "int", "name": "str", "payload": "bytes"},
                           size_limit="32mb") as w:
                for i in range(50_000):
                    w.write({"id": i, "name": " ".join(words[(i + k) % 6] for k in range(3)),
                             "payload": rng.bytes(900)})
        elif name == "large":
            with MDSWriter(out=str(out), columns={"x": "ndarray:float32:25600"}, size_limit="32mb") as w:
                for _ in range(1_000):
                    w.write({"x": rng.standard_normal(25_600).astype(np.float32)})
        else:
            # Small integers: zstd compresses them about 3-4x, as token or label arrays do.
            with MDSWriter(out=str(out), columns={"x": "ndarray:uint8:4096", "y": "int"},
                           compression="zstd", size_limit="64mb") as w:
                for i in range(zstd_mb * 1_000_000 // 4_110):
                    w.write({"x": rng.integers(0, 16, 4096, dtype=np.uint8), "y": i})
        marker.touch()


def shard_files(root: Path, name: str) -> list[Path]:
    """The stored shard files (``warm`` runs leave decompressed copies beside zstd ones)."""
    index = json.loads((root / "bucket" / name / "index.json").read_text())
    return [root / "bucket" / name / (s.get("zip_data") or s["raw_data"])["basename"] for s in index["shards"]]


def decompress_cpu(root: Path, name: str) -> float:
    """Seconds of one core to decompress the dataset's zstd shards (0 for raw shards)."""
    import zstandard

    files = [p for p in shard_files(root, name) if p.suffix == ".zstd"]
    t = time.process_time()
    for p in files:
        reader = zstandard.ZstdDecompressor().stream_reader(p.open("rb"))
        while reader.read(1 << 20):
            pass
    return time.process_time() - t


def num_samples(root: Path, name: str) -> int:
    index = json.loads((root / "bucket" / name / "index.json").read_text())
    return sum(s["samples"] for s in index["shards"])


# -- one run (a fresh process; prints one JSON line) -------------------------------------------
def _length(batch: Any) -> int:
    if isinstance(batch, dict):
        return _length(next(iter(batch.values())))
    if hasattr(batch, "shape"):
        return int(batch.shape[0])
    return len(batch)


def _iterate(items: Any, t0: float, first_only: bool, profile: bool) -> dict[str, Any]:
    first = None
    n = 0
    waits: list[tuple[float, int, float]] = []  # (wait s, samples before, at s)
    last = time.perf_counter()
    for batch in items:
        now = time.perf_counter()
        if first is None:
            first = now - t0
        elif profile and now - last > 0.01:
            waits.append((now - last, n, now - t0))
        n += _length(batch)
        if first_only:
            break
        last = time.perf_counter()
    out: dict[str, Any] = {"first_s": first, "total_s": time.perf_counter() - t0, "samples": n}
    if profile:
        out["waits"] = sorted(waits, reverse=True)[:8]
    return out


def _cpu() -> float:
    """User + system CPU seconds of this process so far (its threads included)."""
    import resource

    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def worker_astream(remote: str | None, local: str, resume: int, profile: bool, pause: float = 0.0) -> dict[str, Any]:
    t0 = time.perf_counter()
    from astream import Loader, StreamingDataset

    import_s = time.perf_counter() - t0
    ds = StreamingDataset(remote=remote, local=local, batch_size=BATCH, num_canonical_nodes=1)
    built = time.perf_counter() - t0
    loader = Loader(ds, batch_size=BATCH)
    if resume:
        loader.load_state_dict({"epoch": 0, "sample_in_epoch": resume, "num_canonical_nodes": 1,
                                "shuffle_seed": 9176, "initial_physical_nodes": 1})
    paused = {}
    if pause:
        time.sleep(pause)  # the program builds its model
        paused = {"paused_s": time.perf_counter() - t0}
    res = _iterate(loader, t0, bool(resume), profile)
    loader.close()
    ds.close()
    return {"import_s": import_s, "built_s": built, "cpu_s": _cpu(), **paused, **res}


def worker_rank(remote: str, local: str, first: bool) -> dict[str, Any]:
    """One rank of a node (its place from the launcher's variables): one epoch of its share."""
    t0 = time.perf_counter()
    wall0 = time.time()
    from astream import Loader, StreamingDataset

    if not first:
        from astream._coord.client import AsyncNodeClient

        # Every request goes as a later shard's: the node serves them in plan order alone.
        ensure_many, prefetch = AsyncNodeClient.ensure_many, AsyncNodeClient.prefetch

        async def no_first_ensure(self: Any, keys: Any, *, pin: bool = False, first: bool = False) -> Any:
            return await ensure_many(self, keys, pin=pin, first=False)

        async def no_first_prefetch(self: Any, keys: Any, *, first: bool = False) -> None:
            await prefetch(self, keys, first=False)

        AsyncNodeClient.ensure_many = no_first_ensure  # type: ignore[method-assign]
        AsyncNodeClient.prefetch = no_first_prefetch  # type: ignore[method-assign]
    import_s = time.perf_counter() - t0
    ds = StreamingDataset(remote=remote, local=local, batch_size=BATCH)
    built = time.perf_counter() - t0
    loader = Loader(ds, batch_size=BATCH)
    res = _iterate(loader, t0, False, False)
    loader.close()
    ds.close()
    return {"import_s": import_s, "built_s": built, "cpu_s": _cpu(), "wall0": wall0, **res}


def run_ranks(mode: str, name: str, root: Path, port: int, scratch: Path, ranks: int, run: int) -> dict[str, Any]:
    """``ranks`` processes of one node over one empty cache; per rank its first batch and epoch."""
    local = tempfile.mkdtemp(prefix=f"{mode}-", dir=str(scratch))
    env = child_env(root.parent)
    env["TMPDIR"] = tempfile.mkdtemp(prefix="tmp-", dir=str(scratch))
    remote = f"http://127.0.0.1:{port}/bucket/{name}"
    load_before = os.getloadavg()[0]
    procs = []
    try:
        for rank in range(ranks):
            env_r = {**env, "RANK": str(rank), "WORLD_SIZE": str(ranks), "LOCAL_RANK": str(rank),
                     "LOCAL_WORLD_SIZE": str(ranks), "ASTREAM_RUN_ID": f"cold-{mode}-{name}-{run}-{os.getpid()}"}
            cmd = [sys.executable, __file__, "--worker", mode, remote, local, "0", "0", "0"]
            procs.append(subprocess.Popen(cmd, env=env_r, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True))
        out = []
        for rank, proc in enumerate(procs):
            stdout, err = proc.communicate(timeout=600)
            if proc.returncode != 0:
                raise SystemExit(f"{mode} {name} rank {rank} failed (exit {proc.returncode}):\n{err[-4000:]}")
            out.append(json.loads(stdout.strip().splitlines()[-1]))
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
        shutil.rmtree(local, ignore_errors=True)
        shutil.rmtree(env["TMPDIR"], ignore_errors=True)
    start = min(r["wall0"] for r in out)
    return {
        "first_s": [r["first_s"] for r in out],  # from each rank's own start
        "first_ex_s": [r["first_s"] - r["import_s"] for r in out],
        "total_s": [r["total_s"] for r in out],
        "skew_s": max(r["wall0"] for r in out) - start,  # how far apart the ranks started
        "samples": sum(r["samples"] for r in out),
        "load": (load_before + os.getloadavg()[0]) / 2,
    }


def worker_mosaic(remote: str, local: str, resume: int, profile: bool) -> dict[str, Any]:
    import warnings

    warnings.simplefilter("ignore")
    t0 = time.perf_counter()
    stub_streaming_vision()
    from streaming import StreamingDataset
    from torch.utils.data import DataLoader

    import_s = time.perf_counter() - t0
    ds = StreamingDataset(remote=remote, local=local, batch_size=BATCH, shuffle=False, num_canonical_nodes=1)
    built = time.perf_counter() - t0
    if resume:
        ds.load_state_dict({"epoch": 0, "sample_in_epoch": resume, "num_canonical_nodes": 1,
                            "shuffle_seed": 9176, "initial_physical_nodes": 1})
    res = _iterate(DataLoader(ds, batch_size=BATCH, num_workers=0), t0, bool(resume), profile)
    return {"import_s": import_s, "built_s": built, **res}


def worker_raw(url: str, local: str) -> dict[str, Any]:
    """aiohttp alone: index.json, then every shard file to disk, 4 at a time."""
    t0 = time.perf_counter()
    import asyncio

    import aiohttp

    import_s = time.perf_counter() - t0
    out: dict[str, float] = {}

    async def main() -> None:
        async with aiohttp.ClientSession(auto_decompress=False) as session:
            async with session.get(f"{url}/index.json") as resp:
                index = json.loads(await resp.read())
            names = [(s.get("zip_data") or s["raw_data"])["basename"] for s in index["shards"]]
            out["index_s"] = time.perf_counter() - t0
            # The first batch's floor: one ranged read of the first shard's offset table and
            # first batch of records (as astream's read-ahead guesses them), or its compressed share.
            first = index["shards"][0]
            stored = (first.get("zip_data") or first["raw_data"])["bytes"]
            share = (4 + 4 * (first["samples"] + 1) + BATCH * 1.25 * first["raw_data"]["bytes"] / first["samples"])
            stop = min(stored, int(share * stored / first["raw_data"]["bytes"]) + (64 << 10))
            async with session.get(f"{url}/{names[0]}", headers={"Range": f"bytes=0-{stop - 1}"}) as resp:
                await resp.read()
            out["ranged_s"] = time.perf_counter() - t0
            gate = asyncio.Semaphore(4)

            async def one(name: str) -> None:
                async with gate, session.get(f"{url}/{name}") as resp:
                    resp.raise_for_status()
                    fd = os.open(os.path.join(local, name), os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
                    try:
                        async for chunk in resp.content.iter_chunked(1 << 20):
                            os.write(fd, chunk)
                    finally:
                        os.close(fd)

            await asyncio.gather(*(one(n) for n in names))

    asyncio.run(main())
    total = time.perf_counter() - t0
    # (The transfer below includes the ranged read: a few percent of one shard.)
    return {"import_s": import_s, "built_s": 0.0, "first_s": total, "total_s": total, "samples": 0,
            "cpu_s": _cpu(), **out}


# -- the driver --------------------------------------------------------------------------------
def run_one(mode: str, name: str, root: Path, port: int, scratch: Path, peer_python: str,
            profile: bool, base: str | None, pause: float) -> dict[str, Any]:
    data_dir = root / "bucket" / name
    local = str(data_dir) if mode == "warm" else tempfile.mkdtemp(prefix=f"{mode}-", dir=str(scratch))
    env = child_env(root.parent)
    env["TMPDIR"] = tempfile.mkdtemp(prefix="tmp-", dir=str(scratch))
    lib = mode.split("-")[0]
    if lib == "base":
        if base is None:
            raise SystemExit("mode base needs --base DIR (a checkout whose astream package to run)")
        env["PYTHONPATH"] = base
        lib = "astream"
    resume = int(num_samples(root, name) * RESUME_AT) // BATCH * BATCH if mode.endswith("-resume") else 0
    python = peer_python if lib == "mosaic" else sys.executable
    if mode == "warm":
        remote = "-"
    elif lib == "mosaic":
        remote = f"s3://bucket/{name}"
        env.update(S3_ENDPOINT_URL=f"http://127.0.0.1:{port}", AWS_ACCESS_KEY_ID="x",
                   AWS_SECRET_ACCESS_KEY="x", AWS_DEFAULT_REGION="us-east-1")
    else:
        remote = f"http://127.0.0.1:{port}/bucket/{name}"
    cmd = [python, __file__, "--worker", "astream" if lib == "warm" else lib, remote, local, str(resume),
           "1" if profile else "0", str(pause if mode.endswith("-pause") else 0.0)]
    try:
        result = measured_child(cmd, env, f"{mode} {name}")
    finally:
        if mode != "warm":
            shutil.rmtree(local, ignore_errors=True)
        shutil.rmtree(env["TMPDIR"], ignore_errors=True)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--data", default=str(BENCH_DATA / "cold"))
    parser.add_argument("--only", nargs="*", default=list(DATASETS), choices=DATASETS)
    parser.add_argument("--modes", nargs="*", default=[m for m in MODES if not m.startswith("base")], choices=MODES)
    parser.add_argument("--base", help="a directory holding another astream package, for the base modes")
    parser.add_argument("--zstd-mb", type=int, default=500, help="raw size of the zstd dataset")
    parser.add_argument("--peer-python", default=PEER_PYTHON)
    parser.add_argument("--profile", action="store_true", help="also list astream's longest waits between batches")
    parser.add_argument("--json", help="also write the raw results here")
    parser.add_argument("--pause", type=float, default=0.5, help="seconds of the *-pause modes' pause")
    parser.add_argument("--ranks", type=int, default=4, help="rank processes of the ranks modes")
    parser.add_argument("--worker", nargs=6, metavar=("LIB", "REMOTE", "LOCAL", "RESUME", "PROFILE", "PAUSE"))
    args = parser.parse_args()
    if args.worker:
        lib, remote, local, resume, profile, pause = args.worker
        if lib == "raw":
            print(json.dumps(worker_raw(remote, local)))
        elif lib in RANK_MODES:
            print(json.dumps(worker_rank(remote, local, lib == "ranks")))
        elif lib == "mosaic":
            print(json.dumps(worker_mosaic(remote, local, int(resume), profile == "1")))
        else:
            print(json.dumps(worker_astream(None if remote == "-" else remote, local, int(resume), profile == "1",
                                            float(pause))))
        return

    data = Path(args.data)
    root = data / "root"
    build_datasets(root, args.only, args.zstd_mb)
    scratch = data / "scratch"
    scratch.mkdir(parents=True, exist_ok=True)
    for python, source in ((sys.executable, "import astream, astream._dataset.loader, aiohttp"),
                           (args.peer_python, "import sys, types; m = types.ModuleType('streaming.vision'); "
                            "m.__path__ = []; sys.modules['streaming.vision'] = m; import streaming, torch")):
        if python == args.peer_python and not any(m.startswith("mosaic") for m in args.modes):
            continue
        subprocess.run([python, "-W", "ignore", "-c", source], env=child_env(data), check=True)  # bytecode cached
    server = subprocess.Popen(
        [sys.executable, "-c", "import sys; from astream.testing import LoopbackServer; "
         "s = LoopbackServer(sys.argv[1]).start(); print(s.port, flush=True); sys.stdin.read()", str(root)],
        stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=child_env(data),
    )
    assert server.stdout is not None
    port = int(server.stdout.readline())
    results: dict[tuple[str, str], list[dict[str, Any]]] = {(n, m): [] for n in args.only for m in args.modes}
    try:
        for r in range(args.runs):
            for name in args.only:
                # Every other round in reverse: on a loaded machine the first run of a round
                # was up to 0.5 s slower (zstd), whichever mode it was.
                for mode in args.modes if r % 2 == 0 else list(reversed(args.modes)):
                    if mode in RANK_MODES:
                        res = run_ranks(mode, name, root, port, scratch, args.ranks, r)
                        results[(name, mode)].append(res)
                        print(f"run {r + 1} {name:5s} {mode:14s} first per rank "
                              f"{[round(f, 3) for f in res['first_ex_s']]} s (imports excluded), slowest epoch "
                              f"{max(res['total_s']):.3f} s, start skew {res['skew_s']:.3f} s load {res['load']:.1f}",
                              file=sys.stderr, flush=True)
                        continue
                    res = run_one(mode, name, root, port, scratch, args.peer_python, args.profile, args.base,
                                  args.pause)
                    results[(name, mode)].append(res)
                    print(f"run {r + 1} {name:5s} {mode:14s} total {res['total_s']:.3f} s first {res['first_s']:.3f} s "
                          f"import {res['import_s']:.3f} s rss {res['rss_mb']:.0f} MB load {res['load']:.1f}"
                          + (f" waits {[(round(w, 3), n, round(t, 3)) for w, n, t in res['waits'][:4]]}"
                             if res.get("waits") else ""),
                          file=sys.stderr, flush=True)
    finally:
        server.stdin.close()  # type: ignore[union-attr]
        server.wait(10)
    if args.json:
        Path(args.json).write_text(json.dumps({"|".join(k): v for k, v in results.items()}, indent=1))
    report(results, root, args)


def report_ranks(results: dict[tuple[str, str], list[dict[str, Any]]], args: Any) -> None:
    runs = {k: rs for k, rs in results.items() if k[1] in RANK_MODES and rs}
    if not runs:
        return
    print(f"\n{args.ranks} ranks on one node (one cache, the agent in its own process), medians over runs; "
          "first batches count from each rank's own start, imports excluded unless said\n")
    print("| dataset | mode | slowest rank's first batch s | fastest rank's | mean | slowest, imports included s "
          "| slowest rank's epoch s | ranks' start skew s |")
    print("|---|---|---:|---:|---:|---:|---:|---:|")
    for (name, mode), rs in runs.items():
        print(f"| {name} | {mode} | {statistics.median(max(r['first_ex_s']) for r in rs):.3f} "
              f"| {statistics.median(min(r['first_ex_s']) for r in rs):.3f} "
              f"| {statistics.median(statistics.mean(r['first_ex_s']) for r in rs):.3f} "
              f"| {statistics.median(max(r['first_s']) for r in rs):.3f} "
              f"| {statistics.median(max(r['total_s']) for r in rs):.3f} "
              f"| {statistics.median(r['skew_s'] for r in rs):.3f} |")


def report(results: dict[tuple[str, str], list[dict[str, Any]]], root: Path, args: Any) -> None:
    report_ranks(results, args)
    results = {k: rs for k, rs in results.items() if k[1] not in RANK_MODES}
    if not results:
        return
    fields = ("total_s", "first_s", "import_s", "built_s", "rss_mb", "index_s", "ranged_s", "cpu_s", "paused_s")
    med = {k: {f: statistics.median(r[f] for r in rs) for f in fields if f in rs[0]} for k, rs in results.items() if rs}
    loads = [r["load"] for rs in results.values() for r in rs]
    print(f"\nmedians of {args.runs} fresh-process runs; batch size {BATCH}; {os.cpu_count()} CPUs; "
          f"load average {min(loads, default=0):.1f}-{max(loads, default=0):.1f} during the runs\n")
    print("| dataset | MB | mode | cold epoch s | first batch s | first batch s, imports excluded | import s "
          "| constructed s | CPU s (process) | peak RSS MB |")
    print("|---|---:|---|---:|---:|---:|---:|---:|---:|---:|")
    for (name, mode), m in med.items():
        mb = sum(p.stat().st_size for p in shard_files(root, name)) / 1e6
        print(f"| {name} | {mb:.0f} | {mode} | {m['total_s']:.3f} | {m['first_s']:.3f} | {m['first_s'] - m['import_s']:.3f} "
              f"| {m['import_s']:.3f} "
              f"| {m['built_s']:.3f} | {m.get('cpu_s', float('nan')):.2f} | {m['rss_mb']:.0f} |")
    print("\nfloor = max(transfer, decompression CPU, warm iteration) + aiohttp import; first-batch floor = "
          "aiohttp import + index.json + one ranged read (raw aiohttp)\n")
    print("| dataset | transfer s | decompress s | warm iter s | aiohttp import s | floor s | astream / floor "
          "| base / floor | first-batch floor s | astream first / floor | base first / floor "
          "| first astream / mosaic (imports excluded) | resume first / floor | base resume first / floor |")
    print("|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")

    def ratio(m: dict[str, float] | None, field: str, floor: float) -> str:
        # From after `import astream` (numpy and astream itself are not the cold path's; the
        # aiohttp import, done lazily, is in both sides).
        return "-" if m is None else f"{(m[field] - m['import_s']) / floor:.2f}x"

    for name in args.only:
        raw, warm = med.get((name, "raw")), med.get((name, "warm"))
        if raw is None or warm is None:
            continue
        a, b, p = med.get((name, "astream")), med.get((name, "base")), med.get((name, "mosaic"))
        transfer = raw["total_s"] - raw["import_s"]
        decomp = decompress_cpu(root, name)
        warm_iter = warm["total_s"] - warm["import_s"]
        floor = max(transfer, decomp, warm_iter) + raw["import_s"]
        first_floor = raw["ranged_s"]
        vs_peer = "-" if a is None or p is None else \
            f"{(a['first_s'] - a['import_s']) / (p['first_s'] - p['import_s']):.2f}x"
        print(f"| {name} | {transfer:.3f} | {decomp:.3f} | {warm_iter:.3f} | {raw['import_s']:.3f} | {floor:.3f} "
              f"| {ratio(a, 'total_s', floor)} | {ratio(b, 'total_s', floor)} | {first_floor:.3f} "
              f"| {ratio(a, 'first_s', first_floor)} | {ratio(b, 'first_s', first_floor)} | {vs_peer} "
              f"| {ratio(med.get((name, 'astream-resume')), 'first_s', first_floor)} "
              f"| {ratio(med.get((name, 'base-resume')), 'first_s', first_floor)} |")
    paused = [(name, mode) for name in args.only for mode in ("astream-pause", "base-pause") if results.get((name, mode))]
    if paused:
        print(f"\nfirst batch after a {args.pause} s pause between Loader() and iterating (the program building "
              "its model), medians; the warm row is a warm cache's first batch (imports excluded)\n")
        print("| dataset | mode | first batch after the pause s | cold epoch after the pause s |")
        print("|---|---|---:|---:|")
        for name, mode in paused:
            runs = results[(name, mode)]
            first = statistics.median(r["first_s"] - r["paused_s"] for r in runs)
            total = statistics.median(r["total_s"] - r["paused_s"] for r in runs)
            print(f"| {name} | {mode} | {first:.3f} | {total:.3f} |")
        for name in args.only:
            if (name, "warm") in med:
                w = med[(name, "warm")]
                print(f"| {name} | warm | {w['first_s'] - w['import_s']:.3f} | |")


if __name__ == "__main__":
    main()
