"""Paired A/B of Parquet streaming: this checkout against ``--base``, or read-ahead on and off.

Each round starts a fresh process per side, in alternating order (the side that runs
first in a round is slower on a shared machine), and each process times ``--per-round``
runs over the same files (4 files x 8 row groups x 32,768 rows, as ``parquet_bench.py``):

- ``--what resume`` (default): a fresh dataset resumed at 90% of the epoch, cold cache:
  milliseconds from ``load_state_dict`` to the first batch in hand, and to the end of the
  epoch;
- ``--what cold`` / ``--what warm``: a whole epoch from a fresh cache / a second epoch,
  rows per second.

The two sides are this checkout and ``--base DIR`` (a checkout of another commit), or,
with ``--no-read-ahead``, this checkout with and without the network read-ahead of a
resume's first row groups (``PREOPEN_NETWORK_BYTES = 0``). ``--http`` reads a loopback HTTP
server in a process of its own (the index written next to the files); ``--bandwidth B``
throttles it to B bytes per second (``astream.testing.LoopbackServer``).

    python benchmarks/parquet_ab_bench.py --base ../astream-base
    python benchmarks/parquet_ab_bench.py --base ../astream-base --http
    python benchmarks/parquet_ab_bench.py --base ../astream-base --what cold --rounds 6
    python benchmarks/parquet_ab_bench.py --no-read-ahead --http --bandwidth 10e6
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from child_env import code_env
from parquet_bench import write

from astream.cli import main as cli

# One side's process: its runs, as JSON (a list of [first batch s, whole s] or of rows/s).
_CHILD = r"""
import json, shutil, sys, tempfile, time
from astream import Loader, StreamingDataset
import astream._dataset.preopen as preopen
remote, total, runs, what, read_ahead = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4], sys.argv[5]
if read_ahead == "off":
    preopen.PREOPEN_NETWORK_BYTES = 0
out = []
for _ in range(runs):
    cache = tempfile.mkdtemp()
    ds = StreamingDataset(remote=remote, local=cache, format="parquet", batch_size=256)
    loader = Loader(ds, num_workers=0)
    if what == "resume":
        state = {**loader.state_dict(), "sample_in_epoch": int(0.9 * total)}
        start = time.perf_counter()
        loader.load_state_dict(state)
        first = None
        for batch in loader:
            if first is None:
                first = time.perf_counter() - start
        out.append([first, time.perf_counter() - start])
    else:
        if what == "warm":
            for _ in loader:
                pass
        start, rows = time.perf_counter(), 0
        for batch in loader:
            rows += len(batch["id"])
        out.append(rows / (time.perf_counter() - start))
    loader.close()
    ds.close()
    shutil.rmtree(cache, ignore_errors=True)  # (the agent may still be finishing a write)
print(json.dumps(out))
"""

_SERVER = r"""
import sys, time
from astream.testing import LoopbackServer
bandwidth = float(sys.argv[2]) or None
with LoopbackServer(sys.argv[1], bandwidth=bandwidth) as server:
    print(server.url, flush=True)
    time.sleep(3600)
"""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    side = parser.add_mutually_exclusive_group(required=True)
    side.add_argument("--base", help="a checkout of another commit: the A side")
    side.add_argument("--no-read-ahead", action="store_true", help="A side: this checkout without the network "
                      "read-ahead of a resume's first row groups")
    parser.add_argument("--what", choices=("resume", "cold", "warm"), default="resume")
    parser.add_argument("--http", action="store_true", help="read a loopback HTTP server")
    parser.add_argument("--bandwidth", type=float, default=0.0, help="the server's bytes per second (with --http)")
    parser.add_argument("--rounds", type=int, default=8)
    parser.add_argument("--per-round", type=int, default=8)
    args = parser.parse_args()

    root = Path(tempfile.mkdtemp(prefix="parquet-ab-"))
    total = write(root, 4, 8, 32768)
    remote, server = str(root), None
    if args.http:
        assert cli(["-q", "index", str(root)]) == 0  # (a web server cannot list)
        server = subprocess.Popen([sys.executable, "-c", _SERVER, str(root), str(args.bandwidth)],
                                  stdout=subprocess.PIPE, text=True, **code_env(dict(os.environ), "this", None))
        assert server.stdout is not None
        remote = server.stdout.readline().strip()
    sides = {"base": "base", "this": "this"} if args.base else {"read-ahead off": "this", "read-ahead on": "this"}
    results: dict[str, list[object]] = {name: [] for name in sides}
    try:
        for r in range(args.rounds):
            for name in list(sides) if r % 2 == 0 else list(sides)[::-1]:
                read_ahead = "off" if name == "read-ahead off" else "on"
                done = subprocess.run(
                    [sys.executable, "-c", _CHILD, remote, str(total), str(args.per_round), args.what, read_ahead],
                    capture_output=True, text=True, check=False, **code_env(dict(os.environ), sides[name], args.base),
                )
                if done.returncode:
                    raise SystemExit(f"{name}: {done.stderr[-3000:]}")
                results[name].extend(json.loads(done.stdout))
    finally:
        if server is not None:
            server.kill()
    print(f"{args.what}, {'HTTP' if args.http else 'local folder'}"
          f"{f' at {args.bandwidth:,.0f} B/s' if args.bandwidth else ''}, {args.rounds} rounds x {args.per_round}")
    medians = {}
    for name, got in results.items():
        if args.what == "resume":
            first = statistics.median(float(x[0]) for x in got)  # type: ignore[index]
            whole = statistics.median(float(x[1]) for x in got)  # type: ignore[index]
            medians[name] = first
            print(f"  {name}: first batch {first * 1e3:.2f} ms, the rest of the epoch {whole * 1e3:.1f} ms (n={len(got)})")
        else:
            medians[name] = statistics.median(float(x) for x in got)  # type: ignore[arg-type]
            print(f"  {name}: {medians[name]:,.0f} rows/s (n={len(got)})")
    a, b = list(medians)
    print(f"  {b} / {a}: {medians[b] / medians[a]:.3f}x")


if __name__ == "__main__":
    main()
