"""Streaming WebDataset tars: astream's ``format="webdataset"`` against the ``webdataset``
package's own pipeline, the same tars.

``--tars`` tars of ``--samples`` samples (a ``cls`` member and a ``--bytes``-byte ``jpg``
member each, no decoding on either side), with the index ``astream index`` wrote. Each case
is a fresh process timing ``--per-round`` passes: ``webdataset``:
``WebDataset(paths, shardshuffle=False).batched(256)`` (in the interpreter of
``--peer-python webdataset=PATH``); astream ``cold``: ``StreamingDataset(format="webdataset")`` +
``Loader(num_workers=0)``, batch 256, from a fresh cache; ``warm``: a second epoch. ``--via
http`` reads the loopback server (``webdataset`` streams each tar's URL).

    python benchmarks/wds_bench.py --peer-python webdataset=PATH
    python benchmarks/wds_bench.py --via local http --libs astream --base main      # paired A/B
"""

from __future__ import annotations

import statistics

from _harness import Bench, Metric, Server, data, fmt, parser, ratio

RATE = Metric("samples/s", lambda r: statistics.median(r["result"]["rows_per_s"]))


def main() -> None:
    p = parser(__doc__, "wds", libs=("astream", "webdataset"))
    p.add_argument("--via", nargs="*", default=["local"], choices=("local", "http"))
    p.add_argument("--tars", type=int, default=8)
    p.add_argument("--samples", type=int, default=4000)
    p.add_argument("--bytes", type=int, default=4096)
    p.add_argument("--per-round", type=int, default=3)
    args = p.parse_args()
    bench = Bench("wds", args)
    per = max(1, int(args.samples * args.scale))
    folder = data.tars(bench.data, "wds", args.tars, per, args.bytes)
    with Server(bench.data, args.bandwidth) as server:
        for via in args.via:
            remote = server.url(folder) if via == "http" else str(folder)
            for what in ("cold", "warm"):
                for side in args.libs:
                    if side == "webdataset" and what == "warm":
                        continue
                    bench.add({"via": via, "what": what}, side, "formats", "webdataset",
                              {"lib": side, "remote": remote, "cache": "{cache}", "what": what,
                               "total": args.tars * per, "repeats": args.per_round})
        bench.run()
    if "base" in bench.codes:
        bench.report_ab([RATE])
        return
    rows = []
    for config in bench.configs():
        peer = bench.median({**config, "what": "cold"}, "webdataset", RATE)
        for side in args.libs:
            mine = bench.median(config, side, RATE)
            if mine is not None:
                vs = fmt(ratio(mine, peer), ".2f") + "x" if side == "astream" and peer else "-"
                rows.append([*config.values(), side, fmt(mine), vs])
    bench.table(f"{args.tars} tars x {per} samples; medians of {args.runs} processes x {args.per_round} passes, "
                f"load {bench.loads()}", ["via", "what", "side", "samples/s", "astream / webdataset"], rows)


if __name__ == "__main__":
    main()
