"""astream, LitData and mosaicml-streaming side by side: the eight configurations of issue 22
(shuffle no/yes x ~1 KB records / ~100 KB arrays x 0 / 2 workers).

Datasets (built once under ``--data``): ``small``, 50,000 x ~1 KB records (8 MB shards);
``large``, 1,000 x 100 KB arrays (64 MB shards); uncompressed MDS written by astream, and the
same samples converted with ``litdata.optimize`` in LitData's interpreter. Each case is a
fresh process: one epoch, batch 32, a warm page cache, timed from the dataset's construction
(imports apart). astream: ``Loader(StreamingDataset(local=...), num_workers=w)``; mosaicml:
torch's ``DataLoader`` over its ``StreamingDataset``; LitData: ``StreamingDataLoader`` over its
``StreamingDataset``, with a collate that keeps ``bytes`` columns as lists.

``--epoch-scale K`` (astream only) makes an epoch K times the dataset (``epoch_size``), so that
it lasts long enough (>= 5 s) for the workers' start not to decide the comparison.

    python benchmarks/peers_bench.py --runs 3 --peer-python mosaicml=PATH --peer-python litdata=PATH
    python benchmarks/peers_bench.py --libs astream --base main          # paired A/B
    python benchmarks/peers_bench.py --libs astream --epoch-scale 60 --workers 0 2
"""

from __future__ import annotations

import itertools
from pathlib import Path

from _harness import Bench, Metric, data, fmt, parser, ratio

SETS = {"small": ("records", 50_000, "8mb"), "large": ("arrays", 1_000, "64mb")}
LABELS = {"small": "50k x ~1 KB", "large": "1k x 100 KB"}
PEERS = ("mosaicml", "litdata")

METRICS = [
    Metric("samples/s", lambda r: r["result"]["epochs"][0]["samples"] / r["result"]["epochs"][0]["total_s"]),
    Metric("first batch s", lambda r: r["result"]["epochs"][0]["first_s"], higher=False, spec=".3f"),
    Metric("CPU s", lambda r: r["proc"]["cpu_s"], higher=False, spec=".2f"),
    Metric("peak RSS MB", lambda r: r["proc"]["peak_rss_mb"], higher=False),
]


def warm_page_cache(folder: Path) -> None:
    for path in folder.rglob("*"):
        if path.is_file():
            with open(path, "rb") as f:
                while f.read(1 << 24):
                    pass


def main() -> None:
    p = parser(__doc__, "peers", libs=("astream", "mosaicml", "litdata"))
    p.add_argument("--only", nargs="*", default=list(SETS), choices=list(SETS))
    p.add_argument("--workers", type=int, nargs="*", default=[0, 2])
    p.add_argument("--epoch-scale", type=int, default=1, help="astream only: epochs of K times the dataset")
    args = p.parse_args()
    if args.epoch_scale > 1 and set(args.libs) - {"astream"}:
        p.error("--epoch-scale applies to astream only: add --libs astream")
    bench = Bench("peers", args)
    folders = {}
    for name in args.only:
        shape, count, limit = SETS[name]
        count = int(count * args.scale)
        folders[name] = data.mds(bench.data, name, shape, count, limit)
        if "litdata" in args.libs and bench.has("litdata"):
            folders[f"lit-{name}"] = data.lit(bench.data, f"lit-{name}", shape, count, str(bench.pythons["litdata"]))
    warm_page_cache(bench.data / "bucket")
    for shuffle, name, workers in itertools.product((False, True), args.only, args.workers):
        size = data.count(folders[name])
        for lib in args.libs:
            folder = folders[f"lit-{name}" if lib == "litdata" else name]
            epoch_size = size * args.epoch_scale if args.epoch_scale > 1 else None
            bench.add({"shuffle": shuffle, "dataset": name, "workers": workers}, lib, "mds", "stream",
                      {"lib": lib, "remote": None, "local": str(folder), "workers": workers, "shuffle": shuffle,
                       **({"epoch_size": epoch_size} if epoch_size else {})})
    bench.run()
    if "base" in bench.codes:
        bench.report_ab(METRICS)
        return
    sides = [s for s in args.libs if bench.has(s)]
    rows = []
    for config in bench.configs():
        rate = {s: bench.median(config, s, METRICS[0]) for s in sides}
        peer = max((v for s, v in rate.items() if s in PEERS and v), default=None)
        rows.append(["yes" if config["shuffle"] else "no", LABELS[config["dataset"]], config["workers"],
                     *(fmt(rate[s]) for s in sides), fmt(ratio(rate.get("astream"), peer), ".2f") + "x"])
    bench.table(f"samples/s, medians of {args.runs} fresh processes, load {bench.loads()}"
                + (f", astream epochs of {args.epoch_scale} x the dataset" if args.epoch_scale > 1 else ""),
                ["shuffle", "samples", "workers", *sides, "astream / faster peer"], rows)


if __name__ == "__main__":
    main()
