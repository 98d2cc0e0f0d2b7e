"""Streaming Parquet: astream's ``format="parquet"`` against pyarrow's own reader (the floor),
Hugging Face ``datasets`` streaming and LitData's Parquet loader, the same files.

Files (built once under ``--data``): ``--files`` files of ``--groups`` row groups of
``--rows`` rows (``id``, ``x``, ``label``, ``text``), with the index ``astream index`` wrote.
Each case is a fresh process timing ``--per-round`` passes or resumptions, each from a fresh
cache (medians of all of them):

- ``cold``: a whole epoch from a fresh cache, rows/s (``pyarrow``: ``iter_batches`` over every
  file, batches turned into NumPy arrays and lists, as astream's come out: the floor);
- ``warm``: a second epoch, every row group cached;
- ``resume``: a fresh dataset resumed at 90 % of the epoch: seconds to the first batch in hand
  from its construction (``resume_s``) and from ``load_state_dict`` (``from_state_s``).

``--via http`` reads the loopback server instead of the folder (astream and Hugging Face,
whose fsspec HTTP file system needs aiohttp in its interpreter; LitData reads the folder
either way). Peers run where their interpreters are found (``--peer-python hf=PATH``,
``litdata=PATH``, or ``--install-peers``).

    python benchmarks/parquet_bench.py
    python benchmarks/parquet_bench.py --via local http --what resume --per-round 15
    python benchmarks/parquet_bench.py --libs astream --base main --what resume cold   # paired A/B
"""

from __future__ import annotations

import statistics
from typing import Any

from _harness import Bench, Metric, Server, data, fmt, parser, ratio

WHATS = ("cold", "warm", "resume")


def _med(key: str) -> Any:
    return lambda r: statistics.median(r["result"][key]) if key in r["result"] else None


METRICS = [
    Metric("rows/s", _med("rows_per_s")),
    Metric("first batch s", _med("first_s"), higher=False, spec=".4f"),
    Metric("resume: first batch s", _med("resume_s"), higher=False, spec=".4f"),
    Metric("resume: from load_state_dict s", _med("from_state_s"), higher=False, spec=".4f"),
]


def main() -> None:
    p = parser(__doc__, "parquet", libs=("astream", "pyarrow", "hf", "litdata"))
    p.add_argument("--what", nargs="*", default=list(WHATS), choices=WHATS)
    p.add_argument("--via", nargs="*", default=["local"], choices=("local", "http"))
    p.add_argument("--files", type=int, default=4)
    p.add_argument("--groups", type=int, default=8)
    p.add_argument("--rows", type=int, default=32768)
    p.add_argument("--per-round", type=int, default=5, help="passes or resumptions in each process")
    args = p.parse_args()
    bench = Bench("parquet", args)
    rows_per_group = max(1, int(args.rows * args.scale))
    folder = data.parquet(bench.data, "parquet", args.files, args.groups, rows_per_group)
    total = args.files * args.groups * rows_per_group
    with Server(bench.data, args.bandwidth) as server:
        for via in args.via:
            for what in args.what:
                for lib in args.libs:
                    if (lib == "pyarrow" and what != "cold") or (lib == "hf" and what == "warm") or (
                            lib in ("pyarrow", "litdata") and via == "http"):
                        continue
                    remote = server.url(folder) if via == "http" else str(folder)
                    bench.add({"via": via, "what": what}, lib, "formats", "parquet",
                              {"lib": lib, "remote": remote, "cache": "{cache}", "what": what, "total": total,
                               "repeats": args.per_round})
        bench.run()
    if "base" in bench.codes:
        bench.report_ab(METRICS)
        return
    rows = []
    for config in bench.configs():
        floor = bench.median({"via": "local", "what": "cold"}, "pyarrow", METRICS[0])  # (one floor: the files)
        peers = [s for s in ("hf", "litdata") if bench.values(config, s, METRICS[0] if config["what"] != "resume"
                                                             else METRICS[2])]
        for side in args.libs:
            got = [bench.median(config, side, m) for m in METRICS]
            if all(v is None for v in got):
                continue
            vs_floor = ratio(got[0], floor) if side == "astream" and config["what"] != "resume" else None
            rows.append([*config.values(), side, *(fmt(v, m.spec) for v, m in zip(got, METRICS, strict=True)),
                         fmt(vs_floor, ".2f") + "x" if vs_floor else "-"])
        for peer in peers:
            m = METRICS[2] if config["what"] == "resume" else METRICS[0]
            mine = ratio(bench.median(config, "astream", m), bench.median(config, peer, m), m.higher)
            rows.append([*config.values(), f"astream vs {peer}", *[""] * len(METRICS), fmt(mine, ".2f") + "x"])
    bench.table(f"{total:,} rows in {args.files} files; medians of {args.runs} processes x {args.per_round}, "
                f"load {bench.loads()}", ["via", "what", "side", *(m.name for m in METRICS), "ratio"], rows)


if __name__ == "__main__":
    main()
