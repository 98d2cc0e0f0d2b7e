"""Iteration: astream's ``Loader`` and ``for sample in ds`` against mosaicml-streaming + torch's
``DataLoader``, warm and cold (a local remote, loopback HTTP), the same files.

Datasets (built once under ``--data``): ``small``, 200,000 records of ~1 KB (``id``, ``name``,
``payload`` 900 bytes); ``large``, 2,000 arrays of 100 KB (float32); uncompressed MDS, 64 MB
shards. Each case is a fresh process that iterates ``--epochs`` epochs: epoch 1 counts from
the dataset's construction (worker start and, for a cold cache, the downloads; imports
apart), the later epochs read the warm cache and start their workers again, as training
does. Caches: ``warm`` (the dataset folder is the cache), ``local`` (an empty cache, the
folder as remote), ``http`` (an empty cache; astream over HTTP, mosaicml over S3 at the
same loopback server). Peak RSS is summed over the process tree (workers, agent).

    python benchmarks/loader_bench.py --runs 3
    python benchmarks/loader_bench.py --runs 1 --only small --libs astream --caches warm
    python benchmarks/loader_bench.py --libs astream --base main      # paired A/B against main
"""

from __future__ import annotations

import itertools
import statistics
from typing import Any

from _harness import Bench, Metric, Server, data, fmt, parser, ratio

SETS = {"small": ("records", 200_000), "large": ("arrays", 2_000)}
CACHES = ("warm", "local", "http")
TARGETS = {"small": (20.0, 3.0), "large": (2.0, 2.0)}  # issue 6: (Loader, for s in ds) x the peer


def _epochs(r: dict[str, Any]) -> list[dict[str, Any]]:
    return list(r["result"]["epochs"])


METRICS = [
    Metric("epoch 1 samples/s", lambda r: _epochs(r)[0]["samples"] / _epochs(r)[0]["total_s"]),
    Metric("later epochs samples/s", lambda r: statistics.median(
        e["samples"] / e["total_s"] for e in _epochs(r)[1:]) if len(_epochs(r)) > 1 else None),
    Metric("first batch s", lambda r: _epochs(r)[0]["first_s"], higher=False, spec=".3f"),
    Metric("peak RSS MB", lambda r: r["proc"]["peak_rss_mb"], higher=False),
]


def main() -> None:
    p = parser(__doc__, "loader", libs=("astream", "mosaicml"))
    p.add_argument("--only", nargs="*", default=list(SETS), choices=list(SETS))
    p.add_argument("--caches", nargs="*", default=list(CACHES), choices=CACHES)
    p.add_argument("--hows", nargs="*", default=["loader", "iter"], choices=("loader", "iter"))
    p.add_argument("--workers", type=int, nargs="*", default=[0, 2], help="Loader worker counts (default 0 2)")
    p.add_argument("--epochs", type=int, default=3)
    args = p.parse_args()
    bench = Bench("loader", args)
    folders = {n: data.mds(bench.data, n, shape, int(count * args.scale)) for n, (shape, count) in SETS.items() if n in args.only}
    hows = [(h, w) for h in args.hows for w in (args.workers if h == "loader" else [0])]
    with Server(bench.data, args.bandwidth) as server:
        for (name, folder), cache, (how, workers), lib in itertools.product(
                folders.items(), args.caches, hows, args.libs):
            remote: str | None = None if cache == "warm" else str(folder)
            env = {}
            if cache == "http":
                remote = server.url(folder) if lib == "astream" else server.s3(folder)
                env = server.s3_env()
            config = {"dataset": name, "cache": cache, "how": f"{how}{workers if how == 'loader' else ''}"}
            bench.add(config, lib, "mds", "stream",
                      {"lib": lib, "remote": remote, "local": str(folder) if cache == "warm" else "{cache}",
                       "workers": workers, "how": how, "epochs": args.epochs}, env)
        bench.run()
    if "base" in bench.codes:
        bench.report_ab(METRICS)
        return
    rows = []
    for config in bench.configs():
        for lib in args.libs:
            rows.append([*config.values(), lib, *(fmt(bench.median(config, lib, m), m.spec) for m in METRICS)])
    bench.table(f"medians of {args.runs} fresh processes, {args.epochs} epochs, batch 32, load {bench.loads()}",
                ["dataset", "cache", "how", "library", *(m.name for m in METRICS)], rows)
    if "mosaicml" not in args.libs or not bench.has("mosaicml"):
        return
    rows = []
    for config in bench.configs():
        loader, it = TARGETS[config["dataset"]]
        target = loader if config["how"].startswith("loader") else it
        rows.append([*config.values(), *(fmt(ratio(bench.median(config, "astream", m),
                                                   bench.median(config, "mosaicml", m), m.higher), ".2f") + "x"
                                         for m in METRICS), f"{target:g}x"])
    bench.table("astream against mosaicml (above 1: astream better)",
                ["dataset", "cache", "how", *(m.name for m in METRICS), "target (throughput)"], rows)


if __name__ == "__main__":
    main()
