"""Would small batches cost less CPU if workers shipped ``str``/``bytes`` columns undecoded?

Today a worker process decodes a batch's ``str``/``bytes`` values into Python objects
(a window of batches at a time, :mod:`astream._dataset.ahead`), pickles them, and the
consumer unpickles them. The alternative measured here: the worker ships each such
column as one ``bytes`` of the batch's records (one copy out of the shard map) with the
values' start and end positions, and the consumer builds the Python objects from it
(``bytes`` as slices of that one object; ``str`` by decoding each slice, or, when the
whole column is ASCII, one decode sliced by position). Both forms go through the
loader's own pickling (:func:`astream._dataset.transport._pickled`).

What it does: opens the first shard of a ``peers_bench.py`` set (``--data``; ``small``:
50,000 x ~1 KB of ``id: int``, ``name: str``, ``payload: bytes``), takes ``--batches``
batches of 32 consecutive records and measures, in this thread (``time.thread_time``),
the CPU per batch of each step of both forms, the forms alternated, the best of
``--repeats`` rounds (the least disturbed by the machine's other work):

- ``decode``: today's window decode (``get_batch`` over 128 batches, sliced per batch);
  ``raw``: the copy of the batch's records and the value positions as lists (the
  positions themselves are precomputed and not counted: a bound in the raw form's favour);
- ``pickle``: the worker's pickling of the batch message;
- ``unpickle``: the consumer's ``pickle.loads``; ``build``: the raw form's objects.

It checks that both forms give equal batches (values, types, order).

Usage::

    .venv/bin/python benchmarks/raw_columns_bench.py --repeats 7
"""

from __future__ import annotations

import argparse
import os
import pickle
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

BENCH_DATA = Path(os.environ.get("ASTREAM_BENCH_DATA", Path(tempfile.gettempdir()) / "astream-bench"))
BATCH = 32
WINDOW = 128  # batches decoded at once, as a decode-ahead window of 4,096 small records


def _best(fn: Callable[[], Any], count: int, repeats: int) -> float:
    """Best of ``repeats`` rounds, µs of this thread's CPU per call."""
    fn()
    best = float("inf")
    for _ in range(repeats):
        began = time.thread_time()
        for _ in range(count):
            fn()
        best = min(best, (time.thread_time() - began) / count * 1e6)
    return best


def _build(column: tuple[str, bytes, list[int], list[int]]) -> list[Any]:
    kind, blob, starts, ends = column
    if kind == "bytes":
        return [blob[a:b] for a, b in zip(starts, ends, strict=True)]
    if blob.isascii():  # byte positions are character positions
        text = blob.decode("ascii")
        return [text[a:b] for a, b in zip(starts, ends, strict=True)]
    view = memoryview(blob)
    return [str(view[a:b], "utf-8") for a, b in zip(starts, ends, strict=True)]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--data", default=str(BENCH_DATA / "peers"))
    p.add_argument("--dataset", default="small")
    p.add_argument("--batches", type=int, default=WINDOW)
    p.add_argument("--repeats", type=int, default=7)
    args = p.parse_args()

    from astream._dataset.transport import _pickled
    from astream._format.encodings.scalars import BytesEncoding, StrEncoding
    from astream._format.index import Index
    from astream._format.record import RecordLayout
    from astream._format.shard import ShardReader

    root = Path(args.data) / args.dataset
    info = Index.from_bytes((root / "index.json").read_bytes()).shards[0]
    layout = RecordLayout.from_shard(info, str(root))
    reader = ShardReader.open(root / info.raw_data.basename, layout, expected_samples=info.samples)
    n = args.batches * BATCH
    if n > reader.num_samples:
        raise SystemExit(f"--batches {args.batches} needs {n} records; the first shard has {reader.num_samples}")
    view = memoryview(reader.buffer)
    offsets = np.frombuffer(reader.buffer, "<u4", reader.num_samples + 1, 4).astype(np.int64)
    raw_cols = [k for k, enc in enumerate(layout.encodings) if isinstance(enc, (BytesEncoding, StrEncoding))]
    if not raw_cols:
        raise SystemExit(f"{root}: no str/bytes columns to ship raw")
    kinds = {k: "bytes" if isinstance(layout.encodings[k], BytesEncoding) else "str" for k in raw_cols}
    spans = [layout.split(view, int(offsets[i])) for i in range(n)]  # precomputed: not timed
    bounds = [(b * BATCH, (b + 1) * BATCH) for b in range(args.batches)]

    def decode_today() -> list[dict[str, Any]]:
        window = reader.get_batch(np.arange(n))
        return [{name: col[a:b].copy() if isinstance(col, np.ndarray) else col[a:b] for name, col in window.items()}
                for a, b in bounds]

    def decode_raw() -> list[dict[str, Any]]:
        out = []
        for a, b in bounds:
            batch: dict[str, Any] = {}
            lo, hi = int(offsets[a]), int(offsets[b])
            blob = bytes(view[lo:hi])
            for k, name in enumerate(layout.names):
                if k in kinds:
                    batch[name] = (kinds[k], blob, [spans[i][k][0] - lo for i in range(a, b)],
                                   [spans[i][k][1] - lo for i in range(a, b)])
            out.append(batch)
        return out

    fixed = [name for k, name in enumerate(layout.names) if k not in kinds]
    window_fixed = {name: reader.get_batch(np.arange(n))[name] for name in fixed}

    def decode_raw_all() -> list[dict[str, Any]]:
        # The fixed-size columns decode as today (one block per window), the rest raw.
        got = decode_raw()
        for (a, b), batch in zip(bounds, got, strict=True):
            for name in fixed:
                col = window_fixed[name]
                batch[name] = col[a:b].copy() if isinstance(col, np.ndarray) else col[a:b]
        return got

    today = decode_today()
    raw = decode_raw_all()
    today_msgs = [_pickled(("batch", batch))[0] for batch in today]
    raw_msgs = [_pickled(("batch", batch))[0] for batch in raw]

    def unpickle(msgs: list[bytes]) -> list[Any]:
        return [pickle.loads(m) for m in msgs]

    def unpickle_build() -> list[Any]:
        out = []
        for m in raw_msgs:
            kind, batch = pickle.loads(m)
            for name, col in batch.items():
                if type(col) is tuple:
                    batch[name] = _build(col)
            out.append((kind, batch))
        return out

    for (_, want), (_, got) in zip(unpickle(today_msgs), unpickle_build(), strict=True):
        if want.keys() != got.keys():
            raise SystemExit(f"the raw form has columns {list(got)}, today's {list(want)}")
        for name in want:
            a, b = want[name], got[name]
            if isinstance(a, np.ndarray):
                same = type(b) is np.ndarray and a.dtype == b.dtype and np.array_equal(a, b)
            else:
                same = a == b and [type(x) for x in a] == [type(x) for x in b]
            if not same:
                raise SystemExit(f"column {name!r}: the raw form's batch differs from today's")

    per = args.batches
    rows: dict[str, dict[str, float]] = {"today": {}, "raw": {}}
    for _ in range(2):  # alternated, twice: each figure the best of both passes
        for form, steps in (
            ("today", {"decode": decode_today, "pickle": lambda: [_pickled(("batch", b)) for b in today],
                       "unpickle": lambda: unpickle(today_msgs)}),
            ("raw", {"decode": decode_raw_all, "pickle": lambda: [_pickled(("batch", b)) for b in raw],
                     "unpickle": unpickle_build}),
        ):
            for step, fn in steps.items():
                cost = _best(fn, 20, args.repeats) / per
                rows[form][step] = min(rows[form].get(step, float("inf")), cost)
    print(f"{root}: {per} batches of {BATCH}, best of {args.repeats} x 2; µs of CPU per batch")
    print("| form | worker: decode | worker: pickle | consumer: unpickle (+ build) | worker | consumer | total |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for form, r in rows.items():
        worker = r["decode"] + r["pickle"]
        print(f"| {form} | {r['decode']:.1f} | {r['pickle']:.1f} | {r['unpickle']:.1f} | {worker:.1f} | "
              f"{r['unpickle']:.1f} | {worker + r['unpickle']:.1f} |")
    reader.close()


if __name__ == "__main__":
    main()
