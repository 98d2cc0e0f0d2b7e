"""Cold start: a fresh process, an empty cache, the shards behind loopback HTTP, against the
transfer floor and mosaicml-streaming.

What a job waits on after every restart on a fresh machine. Modes, each a fresh process per
round, interleaved:

- ``epoch``: one epoch of ``Loader(StreamingDataset(remote="http://127.0.0.1:PORT/bucket/<name>"),
  batch_size=32)`` over an empty cache (mosaicml: its ``StreamingDataset`` + torch
  ``DataLoader`` over ``s3://bucket/<name>`` at the same server; ``raw``: aiohttp alone
  copies the files to disk, 4 at a time: the transfer floor);
- ``resume``: a state at 90 % of the epoch loaded into a fresh loader over an empty cache:
  the time to the first batch;
- ``warm``: astream iterating the dataset folder itself (no remote): the iteration floor;
- ``pause``: as ``epoch``, with a pause of ``--pause`` s between making the loader and
  iterating it (the program building its model): the first batch counts from its end;
- ``ranks``: ``--ranks`` processes of one node (the launcher's variables), one cache, each
  reading its share of one epoch; the slowest rank's first batch is what a synchronous step
  waits for.

Times count from the dataset's construction (after ``import astream``: numpy and the package
are no part of the cold path; aiohttp, imported lazily, is on both sides). The floor of an
epoch is ``max(transfer, decompression CPU, warm iteration) + aiohttp import``; the floor of
the first batch is ``raw``'s time to import aiohttp, fetch index.json and make one ranged
read of the first shard's offset table and first batch.

Datasets: ``small``, 50,000 x ~1 KB records, 32 MB shards; ``large``, 1,000 x 100 KB arrays,
32 MB shards; ``zstd``, ``--zstd-mb`` MB of compressible 4 KB records stored zstd, 64 MB shards.

    python benchmarks/cold_bench.py --runs 3
    python benchmarks/cold_bench.py --runs 1 --only small --modes epoch warm --libs astream raw
    python benchmarks/cold_bench.py --libs astream --modes epoch resume --base main   # paired A/B
"""

from __future__ import annotations

import statistics
import time
from pathlib import Path
from typing import Any

from _harness import Bench, Metric, Server, data, fmt, parser

MODES = ("epoch", "resume", "warm", "pause", "ranks")
BATCH = 32


def _epoch(r: dict[str, Any]) -> dict[str, Any]:
    result = r["result"]
    if isinstance(result, list):  # ranks: the slowest rank
        return {"total_s": max(x["epochs"][0]["total_s"] for x in result),
                "first_s": max(x["epochs"][0]["first_s"] for x in result)}
    return dict(result["epochs"][0])


METRICS = [
    Metric("cold epoch s", lambda r: _epoch(r)["total_s"], higher=False, spec=".3f"),
    Metric("first batch s", lambda r: _epoch(r)["first_s"], higher=False, spec=".3f"),
    Metric("CPU s", lambda r: r["proc"]["cpu_s"], higher=False, spec=".2f"),
    Metric("peak RSS MB", lambda r: r["proc"]["peak_rss_mb"], higher=False),
]


def decompress_cpu(folder: Path) -> float:
    """Seconds of one core to decompress the dataset's zstd shards (0 for raw shards)."""
    import zstandard

    t = time.process_time()
    for path in sorted(folder.glob("shard.*.zstd")):
        with path.open("rb") as f, zstandard.ZstdDecompressor().stream_reader(f) as reader:
            while reader.read(1 << 20):
                pass
    return time.process_time() - t


def main() -> None:
    p = parser(__doc__, "cold", libs=("astream", "mosaicml", "raw"))
    p.add_argument("--only", nargs="*", default=["small", "large", "zstd"], choices=("small", "large", "zstd"))
    p.add_argument("--modes", nargs="*", default=list(MODES), choices=MODES)
    p.add_argument("--zstd-mb", type=int, default=500, help="raw size of the zstd dataset (default 500)")
    p.add_argument("--pause", type=float, default=0.5, help="seconds of the pause mode's pause")
    p.add_argument("--ranks", type=int, default=4, help="rank processes of the ranks mode")
    args = p.parse_args()
    bench = Bench("cold", args)
    sets = {"small": ("records", 50_000, "32mb"), "large": ("arrays", 1_000, "32mb"),
            "zstd": ("zstd", args.zstd_mb * 1_000_000 // 4_110, "64mb")}
    folders = {n: data.mds(bench.data, n, shape, int(count * args.scale), limit)
               for n, (shape, count, limit) in sets.items() if n in args.only}
    with Server(bench.data, args.bandwidth) as server:
        for name, folder in folders.items():
            resume = int(data.count(folder) * 0.9) // BATCH * BATCH
            for mode in args.modes:
                config = {"dataset": name, "mode": mode}
                for lib in args.libs:
                    if lib == "raw":
                        if mode == "epoch":
                            bench.add(config, "raw", "mds", "raw", {"url": server.url(folder), "local": "{cache}"})
                        continue
                    if lib == "mosaicml" and mode not in ("epoch", "resume"):
                        continue
                    remote = server.url(folder) if lib == "astream" else server.s3(folder)
                    params: dict[str, Any] = {"lib": lib, "remote": remote, "local": "{cache}", "canonical_nodes": 1}
                    if mode == "warm":
                        params.update(remote=None, local=str(folder))
                    params["resume"] = resume if mode == "resume" else 0
                    params["pause_s"] = args.pause if mode == "pause" else 0.0
                    if mode == "ranks":
                        params["canonical_nodes"] = None
                    bench.add(config, lib, "mds", "stream", params, server.s3_env() if lib == "mosaicml" else None,
                              ranks=args.ranks if mode == "ranks" else 1)
        bench.run()
    if "base" in bench.codes:
        bench.report_ab(METRICS)
        return
    rows = []
    for config in bench.configs():
        for side in ("astream", "mosaicml", "raw"):
            if bench.values(config, side, METRICS[0]):
                rows.append([*config.values(), side, *(fmt(bench.median(config, side, m), m.spec) for m in METRICS)])
    bench.table(f"medians of {args.runs} fresh processes, batch {BATCH}, load {bench.loads()}",
                ["dataset", "mode", "side", *(m.name for m in METRICS)], rows)
    floors(bench, folders)


def floors(bench: Bench, folders: dict[str, Path]) -> None:
    """Each dataset's floors, and astream's and mosaicml's figures against them."""
    rows = []
    for name, folder in folders.items():
        def med(mode: str, side: str, get: Any, name: str = name) -> float | None:
            values = [get(r) for r in bench.records if r["config"] == {"dataset": name, "mode": mode}
                      and r["side"] == side]
            return statistics.median(values) if values else None

        raw_import = med("epoch", "raw", lambda r: r["result"]["import_s"])
        transfer = med("epoch", "raw", lambda r: r["result"]["epochs"][0]["total_s"] - r["result"]["import_s"])
        warm = med("warm", "astream", lambda r: r["result"]["epochs"][0]["total_s"])
        if raw_import is None or transfer is None or warm is None:
            continue
        decomp = decompress_cpu(folder)
        floor = max(transfer, decomp, warm) + raw_import
        first_floor = med("epoch", "raw", lambda r: r["result"]["first_s"])
        cold = med("epoch", "astream", lambda r: r["result"]["epochs"][0]["total_s"])
        first = med("epoch", "astream", lambda r: r["result"]["epochs"][0]["first_s"])
        peer_first = med("epoch", "mosaicml", lambda r: r["result"]["epochs"][0]["first_s"])
        resume = med("resume", "astream", lambda r: r["result"]["epochs"][0]["first_s"])
        mb = data.stored_bytes(folder) / 1e6

        def x(a: float | None, b: float | None) -> str:
            return "-" if a is None or not b else f"{a / b:.2f}x"

        rows.append([name, f"{mb:.0f}", f"{transfer:.3f}", f"{decomp:.3f}", f"{warm:.3f}", f"{raw_import:.3f}",
                     f"{floor:.3f}", x(cold, floor), fmt(first_floor, ".3f"), x(first, first_floor),
                     x(first, peer_first), x(resume, first_floor)])
    if rows:
        bench.table("floor = max(transfer, decompression CPU, warm iteration) + aiohttp import; first-batch floor = "
                    "aiohttp import + index.json + one ranged read",
                    ["dataset", "MB", "transfer s", "decompress s", "warm iter s", "aiohttp import s", "floor s",
                     "astream / floor", "first-batch floor s", "first / floor", "first / mosaicml", "resume / floor"],
                    rows)


if __name__ == "__main__":
    main()
