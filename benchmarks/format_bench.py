"""Write and read throughput of the MDS format: astream against mosaicml-streaming, the same
samples and files.

Datasets, written once per round by each writer (the samples made before the clock): ``small``,
~1 KB records (``id``, ``name``, ``payload`` 900 bytes); ``large``, ~100 KB float32 arrays;
``fixed``, ~300 B records whose columns are all fixed-size (the case ``get_batch``
vectorises completely); 16 MB shards. astream's writer fsyncs every shard and index.json
(the peer's does not): the ``astream-nofsync`` side stubs ``os.fsync`` out to show what that
durability costs. Reads go over the files astream wrote (byte-identical to the peer's):
``ds[i]`` for every sample in a random order, and ``get_batch`` of 256 random ids.

    python benchmarks/format_bench.py --runs 3
    python benchmarks/format_bench.py --scale 0.2 --runs 5 --peer-python mosaicml=PATH
"""

from __future__ import annotations

from _harness import Bench, Metric, fmt, parser, ratio

SETS = {"small": ("records", 50_000), "large": ("arrays", 500), "fixed": ("fixed", 160_000)}

METRICS = [
    Metric("write s", lambda r: r["result"].get("write_s"), higher=False, spec=".3f"),
    Metric("get s (every sample)", lambda r: r["result"].get("get_s"), higher=False, spec=".3f"),
    Metric("get_batch(256) s", lambda r: r["result"].get("get_batch_s"), higher=False, spec=".3f"),
]


def main() -> None:
    p = parser(__doc__, "format", libs=("astream", "mosaicml"))
    p.add_argument("--only", nargs="*", default=list(SETS), choices=list(SETS))
    args = p.parse_args()
    bench = Bench("format", args)
    for name in args.only:
        shape, count = SETS[name]
        count = max(1, int(count * args.scale))
        out = str(bench.data / "bucket" / f"{name}-read")
        for side in args.libs:
            bench.add({"dataset": name, "op": "write"}, side, "files", "write",
                      {"lib": side, "shape": shape, "count": count, "out": "{cache}/ds"})
        bench.add({"dataset": name, "op": "write"}, "astream-nofsync", "files", "write",
                  {"lib": "astream", "shape": shape, "count": count, "out": "{cache}/ds", "fsync": False})
        for side in args.libs:
            bench.add({"dataset": name, "op": "read"}, side, "files", "read", {"lib": side, "folder": out})
        if not (bench.data / "bucket" / f"{name}-read" / "index.json").exists():  # the files read
            bench.once({"dataset": name, "op": "build"}, "astream", "files", "write",
                       {"lib": "astream", "shape": shape, "count": count, "out": out})
    bench.run()
    if "base" in bench.codes:
        bench.report_ab(METRICS)
        return
    rows = []
    for name in args.only:
        w, rd = {"dataset": name, "op": "write"}, {"dataset": name, "op": "read"}
        a = {m.name: bench.median(w if m is METRICS[0] else rd, "astream", m) for m in METRICS}
        peer = {m.name: bench.median(w if m is METRICS[0] else rd, "mosaicml", m) for m in METRICS}
        nofsync = bench.median(w, "astream-nofsync", METRICS[0])
        rows.append([name, fmt(a["write s"], ".3f"), fmt(nofsync, ".3f"), fmt(peer["write s"], ".3f"),
                     fmt(a["get s (every sample)"], ".3f"), fmt(peer["get s (every sample)"], ".3f"),
                     fmt(a["get_batch(256) s"], ".3f"),
                     fmt(ratio(a["get s (every sample)"], peer["get s (every sample)"], False), ".1f") + "x",
                     fmt(ratio(a["get_batch(256) s"], a["get s (every sample)"], False), ".1f") + "x"])
    bench.table(f"medians of {args.runs} rounds (fresh processes), load {bench.loads()}",
                ["dataset", "write astream s", "without fsync s", "write mosaicml s", "get astream s",
                 "get mosaicml s", "get_batch astream s", "get vs mosaicml", "get_batch vs get"], rows)


if __name__ == "__main__":
    main()
