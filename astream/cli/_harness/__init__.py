"""The benchmark harness behind ``benchmarks/`` and ``astream bench compare``.

- :mod:`.data`: the datasets (~1 KB records, ~100 KB arrays, zstd records, Parquet,
  WebDataset tars), built once under a data folder;
- :mod:`.server`: the loopback server of the cold runs, in its own process, throttled on
  request;
- :mod:`.peers`: the peers' interpreters, found or created with the pinned versions;
- :mod:`.work`: what a fresh process runs (the workloads of astream and of each peer);
- :mod:`.proc`: fresh-process runs with the CPU and peak RSS of the process tree;
- :mod:`.checkouts`: the other side of a paired A/B (a checkout, or a commit);
- :mod:`.bench`: cases, rounds, the JSON-lines results, medians, tables, the paired A/B;
- :mod:`.args`: the options every benchmark takes.

Benchmark names (docs/bench/README.md maps those of the old layout): every script of
``benchmarks/`` takes ``--base REF`` for a paired A/B of astream against another checkout
or commit; the benchmark, its workloads and datasets are this checkout's, only the
``astream`` package comes from REF.
"""

from astream.cli._harness import data
from astream.cli._harness.args import parser
from astream.cli._harness.bench import Bench, Metric, fmt, ratio
from astream.cli._harness.server import Server

__all__ = ["Bench", "Metric", "Server", "data", "fmt", "parser", "ratio"]
