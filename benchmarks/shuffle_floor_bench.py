"""The floor of a shuffled epoch of small ``str``/``bytes`` records, against sequential.

Question: can a shuffled epoch of ~1 KB records with ``str``/``bytes`` columns reach
0.8x the unshuffled one on this machine at all? The cheapest code that returns the same
values (an ``int64`` array of ids, lists of Python ``str`` and ``bytes``) is timed over
the same records, once in file order and once in the epoch plan's shuffled order, in one
process, alternated; astream's ``Loader`` over the same dataset is timed beside it.

The cheap code reads the mapped shards itself (the MDS layout: a ``u32`` count, ``u32``
record offsets, each record ``u32`` lengths of its variable columns then the columns):
per shard, NumPy gathers the records' heads and ids, and one list comprehension per
column builds the ``str``/``bytes`` objects out of a ``memoryview`` of the map. Modes:

- ``seq``: every shard's records in file order (what an unshuffled epoch reads);
- ``plan``: the plan's order, record by record (no grouping);
- ``window``: the plan's order in windows of 4,096 records, each window sorted by shard
  and offset (as astream decodes ahead), then the values put back in plan order;
- ``gather``: ``window``, but each window's record bytes are first copied into one
  contiguous buffer by a NumPy gather of fixed 1 KB rows, and the objects built from it;
- ``gather-inplace``: ``gather`` without reordering the rows: the objects are built in
  plan order straight from the file-ordered rows (in cache), so they are made and freed
  in the order the batches use them;
- ``copy-seq`` / ``copy-window``: only the NumPy gather of 1 KB rows (no Python objects);
- ``window-16k`` / ``window-all``: ``window`` with windows of 16,384 records / the epoch;
- ``window-unordered``: ``window`` without putting the values back in plan order (wrong
  order: only to see what the put-back and freeing in another order than made cost);
- ``astream-decode-seq`` / ``astream-decode-window``: astream's own decode of the same
  windows (``ShardReader.get_batch`` per shard; ``decode_ahead`` of the plan's windows).

Prints ns of CPU per record (median of ``--reps`` passes over the whole epoch) and the
shuffled / sequential ratios; ``astream`` rows are a ``Loader(ds, batch_size=32)``
without workers, epochs after the first, in the same process.

``--faults`` instead times the ``Loader``'s later epochs in fresh processes (``--reps``
of each, ``--epochs`` each) with its minor page faults: as is, with the map pages never
handed back, and with glibc's heap never trimmed too.

Usage (the ``smallvar`` set of ``workers_bench.py``, built by it)::

    .venv/bin/python benchmarks/shuffle_floor_bench.py --reps 7
    .venv/bin/python benchmarks/shuffle_floor_bench.py --faults --reps 3 --epochs 20
"""

from __future__ import annotations

import argparse
import itertools
import json
import mmap
import operator
import os
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import numpy.typing as npt

BENCH_DATA = Path(os.environ.get("ASTREAM_BENCH_DATA", Path(tempfile.gettempdir()) / "astream-bench"))
WINDOW = 4096
ROW = 1024
Ints = npt.NDArray[np.int64]


class Shard:
    """One mapped MDS shard of ``int``, ``str``, ``bytes`` records (8-byte id first)."""

    def __init__(self, path: Path) -> None:
        with open(path, "rb") as f:
            self.map = mmap.mmap(f.fileno(), 0, access=mmap.ACCESS_READ)
        self.u8 = np.frombuffer(self.map, np.uint8)
        self.view = memoryview(self.map)
        n = int(self.u8[:4].view(np.uint32)[0])
        self.offsets = self.u8[4 : 4 + 4 * (n + 1)].view(np.uint32).astype(np.int64)[:-1]
        # Row views at every byte: a take of records' starts copies whole rows (no index per byte).
        self.head = np.lib.stride_tricks.sliding_window_view(self.u8, 16)
        self.win = np.lib.stride_tricks.sliding_window_view(self.u8, ROW)

    def decode(self, idx: Ints) -> tuple[Ints, list[str], list[bytes]]:
        """Records ``idx``: ids, names, payloads; the cheapest NumPy + Python there is."""
        begin = self.offsets[idx]
        head = self.head[begin]  # two u32 lengths, then the int64 id
        heads = head[:, :8].copy().view(np.uint32).astype(np.int64)
        ids = head[:, 8:].copy().view(np.int64).reshape(-1)
        name_a = begin + 16
        name_b = name_a + heads[:, 0]
        pay_b = name_b + heads[:, 1]
        view = self.view
        names = [str(view[a:b], "utf-8") for a, b in zip(name_a.tolist(), name_b.tolist(), strict=True)]
        pays = [bytes(view[a:b]) for a, b in zip(name_b.tolist(), pay_b.tolist(), strict=True)]
        return ids, names, pays

    def rows(self, idx: Ints) -> npt.NDArray[np.uint8]:
        """The first ``ROW`` bytes of records ``idx``, one NumPy gather."""
        out: npt.NDArray[np.uint8] = self.win[np.minimum(self.offsets[idx], len(self.u8) - ROW)]
        return out


def decode_rows(rows: npt.NDArray[np.uint8]) -> tuple[Ints, list[str], list[bytes]]:
    """The same values out of records copied into contiguous ``ROW``-byte rows."""
    heads = rows[:, :8].copy().view(np.uint32).astype(np.int64)
    ids = rows[:, 8:16].copy().view(np.int64).reshape(-1)
    base = np.arange(len(rows), dtype=np.int64) * ROW
    name_a = base + 16
    name_b = name_a + heads[:, 0]
    pay_b = name_b + np.minimum(heads[:, 1], ROW - 16 - heads[:, 0])  # (the row holds the first ROW bytes)
    view = rows.reshape(-1).data
    names = [str(view[a:b], "utf-8") for a, b in zip(name_a.tolist(), name_b.tolist(), strict=True)]
    pays = [bytes(view[a:b]) for a, b in zip(name_b.tolist(), pay_b.tolist(), strict=True)]
    return ids, names, pays


def run_seq(shards: list[Shard], _: Ints, __: Ints) -> int:
    n = 0
    for shard in shards:
        for a in range(0, len(shard.offsets), WINDOW):
            _ids, names, _pays = shard.decode(np.arange(a, min(a + WINDOW, len(shard.offsets))))
            n += len(names)
    return n


def run_plan(shards: list[Shard], sh: Ints, off: Ints) -> int:
    # Record by record, in the plan's order: the Python cost of one record at a time.
    n = 0
    views = [s.view for s in shards]
    offs = [s.offsets for s in shards]
    u32 = [s.u8 for s in shards]
    for s, o in zip(sh.tolist(), off.tolist(), strict=True):
        b = int(offs[s][o])
        la, lb = u32[s][b : b + 8].view(np.uint32).tolist()
        v = views[s]
        str(v[b + 16 : b + 16 + la], "utf-8")
        bytes(v[b + 16 + la : b + 16 + la + lb])
        n += 1
    return n


def _windows(sh: Ints, off: Ints, size: int = WINDOW) -> Any:
    for a in range(0, len(sh), size):
        s, o = sh[a : a + size], off[a : a + size]
        order = np.argsort(s * (int(o.max()) + 1) + o)
        grouped = s[order]
        cuts = [0, *(np.flatnonzero(grouped[1:] != grouped[:-1]) + 1).tolist(), len(s)]
        inverse = np.empty(len(s), np.intp)
        inverse[order] = np.arange(len(s))
        yield order, grouped, cuts, o, inverse


def run_window(shards: list[Shard], sh: Ints, off: Ints, size: int = WINDOW, put_back: bool = True) -> int:
    n = 0
    for order, grouped, cuts, o, inverse in _windows(sh, off, size):
        ids_p, names_p, pays_p = [], [], []
        for a, b in itertools.pairwise(cuts):
            ids, names, pays = shards[int(grouped[a])].decode(o[order[a:b]])
            ids_p.append(ids)
            names_p.append(names)
            pays_p.append(pays)
        if not put_back:  # (the values left in file order, freed in the order they were made)
            n += len(inverse)
            continue
        pick = operator.itemgetter(*inverse.tolist())
        # (kept until the next window, as a reader's window is: freed in plan order then)
        _ids_all = np.concatenate(ids_p)[inverse]
        names_all = pick(list(itertools.chain.from_iterable(names_p)))
        _pays_all = pick(list(itertools.chain.from_iterable(pays_p)))
        n += len(names_all)
    return n


def run_gather(shards: list[Shard], sh: Ints, off: Ints) -> int:
    n = 0
    for order, grouped, cuts, o, inverse in _windows(sh, off):
        rows = np.concatenate([shards[int(grouped[a])].rows(o[order[a:b]]) for a, b in itertools.pairwise(cuts)])
        _ids, names, _pays = decode_rows(rows[inverse])  # (rows put in plan order first: objects in order)
        n += len(names)
    return n


def run_gather_inplace(shards: list[Shard], sh: Ints, off: Ints) -> int:
    # The window's rows copied in file order, the objects built from them in plan order
    # (made, then freed, in the order the batches use them; read from a buffer in cache).
    n = 0
    for order, grouped, cuts, o, inverse in _windows(sh, off):
        rows = np.concatenate([shards[int(grouped[a])].rows(o[order[a:b]]) for a, b in itertools.pairwise(cuts)])
        heads = rows[:, :8].copy().view(np.uint32).astype(np.int64)[inverse]
        _ids = rows[:, 8:16].copy().view(np.int64).reshape(-1)[inverse]
        name_a = inverse.astype(np.int64) * ROW + 16
        name_b = name_a + heads[:, 0]
        pay_b = name_b + np.minimum(heads[:, 1], ROW - 16 - heads[:, 0])
        view = rows.reshape(-1).data
        names = [str(view[a:b], "utf-8") for a, b in zip(name_a.tolist(), name_b.tolist(), strict=True)]
        _pays = [bytes(view[a:b]) for a, b in zip(name_b.tolist(), pay_b.tolist(), strict=True)]
        n += len(names)
    return n


def run_copy_seq(shards: list[Shard], _: Ints, __: Ints) -> int:
    n = 0
    for shard in shards:
        for a in range(0, len(shard.offsets), WINDOW):
            n += len(shard.rows(np.arange(a, min(a + WINDOW, len(shard.offsets)))))
    return n


def run_copy_window(shards: list[Shard], sh: Ints, off: Ints) -> int:
    n = 0
    for order, grouped, cuts, o, _ in _windows(sh, off):
        n += sum(len(shards[int(grouped[a])].rows(o[order[a:b]])) for a, b in itertools.pairwise(cuts))
    return n


def astream_sources(shards: list[Shard]) -> tuple[list[Any], list[Any]]:
    """astream's own shard readers over the same maps, and their layouts."""
    from astream._format.record import RecordLayout
    from astream._format.shard import ShardReader

    layout = RecordLayout.from_columns({"id": "int", "name": "str", "payload": "bytes"})
    return [ShardReader(s.map, layout, shard=k) for k, s in enumerate(shards)], [layout] * len(shards)


def run_astream_seq(shards: list[Shard], _: Ints, __: Ints) -> int:
    # astream's decode of an unshuffled window: one get_batch per shard and window.
    n = 0
    for reader in _ASTREAM[0]:
        for a in range(0, reader.num_samples, WINDOW):
            n += len(reader.get_batch(np.arange(a, min(a + WINDOW, reader.num_samples)))["name"])
    return n


def run_astream_window(shards: list[Shard], sh: Ints, off: Ints) -> int:
    # astream's decode_ahead over the plan's 4,096-record windows (it groups them itself).
    from astream._dataset.ahead import decode_ahead

    readers, layouts = _ASTREAM
    n = 0
    for a in range(0, len(sh), WINDOW):
        ahead = decode_ahead(layouts, readers.__getitem__, sh[a : a + WINDOW], off[a : a + WINDOW], a)
        assert ahead is not None
        n += ahead.stop - ahead.start
    return n


_ASTREAM: tuple[list[Any], list[Any]] = ([], [])

MODES: dict[str, Callable[[list[Shard], Ints, Ints], int]] = {
    "seq": run_seq, "plan": run_plan, "window": run_window, "gather": run_gather,
    # Larger windows: the records of a shard a window takes lie closer together.
    "window-16k": lambda shards, sh, off: run_window(shards, sh, off, 4 * WINDOW),
    "window-all": lambda shards, sh, off: run_window(shards, sh, off, len(sh)),
    "window-unordered": lambda shards, sh, off: run_window(shards, sh, off, put_back=False),
    "gather-inplace": run_gather_inplace,
    "copy-seq": run_copy_seq, "copy-window": run_copy_window,
    "astream-decode-seq": run_astream_seq, "astream-decode-window": run_astream_window,
}


def loader_pass(root: Path, shuffle: bool, epochs: int) -> list[float]:
    """ns of CPU per sample of astream's ``Loader`` (no workers), epochs after the first."""
    from astream import Loader, StreamingDataset

    ds = StreamingDataset(local=str(root), batch_size=32, shuffle=shuffle)
    loader = Loader(ds)
    out = []
    for e in range(epochs):
        cpu = time.process_time()
        n = sum(len(b["name"]) for b in loader)
        if e:
            out.append((time.process_time() - cpu) / n * 1e9)
    loader.close()
    ds.close()
    return out


def thread_cpu() -> dict[str, float]:
    """CPU seconds (user + system) of each thread of this process, by thread name."""
    import threading

    names = {t.native_id: t.name for t in threading.enumerate()}
    out: dict[str, float] = {}
    for tid in os.listdir("/proc/self/task"):
        fields = Path(f"/proc/self/task/{tid}/stat").read_text().rsplit(")", 1)[1].split()
        name = names.get(int(tid)) or Path(f"/proc/self/task/{tid}/comm").read_text().strip()
        out[name] = out.get(name, 0.0) + (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    return out


def faults_child(root: Path, shuffle: bool, epochs: int, no_drop: bool) -> None:
    """One process: a Loader's later epochs, CPU, system time and minor faults per record."""
    import resource

    import astream._dataset.shards as shards_module

    if no_drop:  # the touched map pages never handed back (RSS then grows to the maps read)
        shards_module.RESIDENT_BUDGET = 1 << 62
    from astream import Loader, StreamingDataset

    ds = StreamingDataset(local=str(root), batch_size=32, shuffle=shuffle)
    loader = Loader(ds)
    n = sum(len(b["name"]) for b in loader)  # the first epoch: shards opened, code warm
    r0, cpu, t0 = resource.getrusage(resource.RUSAGE_SELF), time.process_time(), thread_cpu()
    for _ in range(epochs):
        n = sum(len(b["name"]) for b in loader)
    r1, cpu, t1 = resource.getrusage(resource.RUSAGE_SELF), time.process_time() - cpu, thread_cpu()
    loader.close()
    ds.close()
    total = n * epochs
    print(json.dumps({"cpu": cpu / total * 1e9, "sys": (r1.ru_stime - r0.ru_stime) / total * 1e9,
                      "faults": (r1.ru_minflt - r0.ru_minflt) / epochs,
                      "main": (t1.get("MainThread", 0) - t0.get("MainThread", 0)) / total * 1e9,
                      "loop": (t1.get("astream-sync", 0) - t0.get("astream-sync", 0)) / total * 1e9}))


def faults(root: Path, runs: int, epochs: int) -> None:
    """Where a shuffled epoch's extra system time goes: page faults, by cause.

    Variants, each in fresh processes: as is; the map pages never handed back (the
    resident budget off); and glibc's heap never trimmed (``MALLOC_TRIM_THRESHOLD_``,
    ``MALLOC_TOP_PAD_``: freed objects' pages not returned to the kernel and faulted in
    again by the next window's objects).
    """
    import subprocess
    import sys

    variants = {"as is": ({}, False), "no page drop": ({}, True),
                "no page drop, no heap trim": ({"MALLOC_TRIM_THRESHOLD_": str(1 << 32),
                                                "MALLOC_TOP_PAD_": str(64 << 20)}, True)}
    got: dict[tuple[str, bool], list[dict[str, float]]] = {}
    for _ in range(runs):
        for name, (env, no_drop) in variants.items():
            for shuffle in (False, True):
                cmd = [sys.executable, __file__, "--faults-child", "--data", str(root), "--epochs", str(epochs)]
                cmd += (["--shuffle"] if shuffle else []) + (["--no-drop"] if no_drop else [])
                out = subprocess.run(cmd, capture_output=True, text=True, check=True, timeout=600,
                                     env={**os.environ, **env}).stdout
                got.setdefault((name, shuffle), []).append(json.loads(out.strip().splitlines()[-1]))
    print(f"load {os.getloadavg()[0]:.1f}")
    print("| variant | shuffle | ns CPU / record | of it system | main thread | loop thread | minor faults / epoch |")
    print("|---|---|---:|---:|---:|---:|---:|")
    for (name, shuffle), rs in got.items():
        med = {k: statistics.median(r[k] for r in rs) for k in ("cpu", "sys", "main", "loop", "faults")}
        print(f"| {name} | {'yes' if shuffle else 'no'} | {med['cpu']:,.0f} | {med['sys']:,.0f} | {med['main']:,.0f} "
              f"| {med['loop']:,.0f} | {med['faults']:,.0f} |")


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--data", default=str(BENCH_DATA / "workers" / "smallvar"))
    p.add_argument("--reps", type=int, default=7)
    p.add_argument("--epochs", type=int, default=4, help="astream Loader epochs per pass (the first not counted)")
    p.add_argument("--no-astream", action="store_true")
    p.add_argument("--faults", action="store_true", help="only the Loader's page faults, by cause (fresh processes)")
    p.add_argument("--faults-child", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--shuffle", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--no-drop", action="store_true", help=argparse.SUPPRESS)
    args = p.parse_args()
    root = Path(args.data)
    if args.faults_child:
        faults_child(root, args.shuffle, args.epochs, args.no_drop)
        return
    if args.faults:
        faults(root, args.reps, args.epochs)
        return
    if not (root / "index.json").exists():
        raise SystemExit(f"no dataset at {root}: run benchmarks/workers_bench.py --only smallvar --runs 1 first")
    from astream import StreamingDataset

    index = json.loads((root / "index.json").read_text())
    shards = [Shard(root / s["raw_data"]["basename"]) for s in index["shards"]]
    starts = np.cumsum([0] + [len(s.offsets) for s in shards])
    ds = StreamingDataset(local=str(root), batch_size=32, shuffle=True)
    ids = ds.plan(epoch=1, sample_in_epoch=0, workers_per_rank=1).rank_order(0, 0)
    ds.close()
    sh = np.searchsorted(starts, ids, side="right") - 1
    off = ids - starts[sh]
    # The cheap code returns what the shards hold: check it once against the plan's ids.
    got = shards[int(sh[0])].decode(off[:1])[0]
    assert int(got[0]) == int(ids[0]), (got, ids[0])
    _ASTREAM[0][:], _ASTREAM[1][:] = astream_sources(shards)
    times: dict[str, list[float]] = {m: [] for m in MODES}
    for m in MODES:  # warm: the maps faulted in, the code paths run once
        MODES[m](shards, sh, off)
    astream_ns: dict[bool, list[float]] = {False: [], True: []}
    loads = [os.getloadavg()[0]]
    for rep in range(args.reps):
        for m, fn in MODES.items():
            cpu = time.process_time()
            n = fn(shards, sh, off)
            times[m].append((time.process_time() - cpu) / n * 1e9)
        if not args.no_astream and rep < 3:
            for shuffle in (False, True):
                astream_ns[shuffle] += loader_pass(root, shuffle, args.epochs)
        loads.append(os.getloadavg()[0])
    med = {m: statistics.median(t) for m, t in times.items()}
    print(f"{len(ids):,} records, {len(shards)} shards; load {min(loads):.1f}-{max(loads):.1f}")
    print("| mode | ns CPU / record (median) | min | sequential / this |")
    print("|---|---:|---:|---:|")
    for m, v in med.items():
        base = med["copy-seq"] if m.startswith("copy") else med["astream-decode-seq"] if m.startswith("astream") \
            else med["seq"]
        print(f"| {m} | {v:,.0f} | {min(times[m]):,.0f} | {base / v:.2f} |")
    if not args.no_astream:
        a0, a1 = statistics.median(astream_ns[False]), statistics.median(astream_ns[True])
        print(f"| astream unshuffled | {a0:,.0f} | {min(astream_ns[False]):,.0f} | |")
        print(f"| astream shuffled | {a1:,.0f} | {min(astream_ns[True]):,.0f} | {a0 / a1:.2f} |")
        best = min(med["window"], med["gather"], med["plan"])  # the 4 MB windows astream decodes
        d0, d1 = med["astream-decode-seq"], med["astream-decode-window"]
        print(f"\nastream's decode over the floor: sequential {d0 / med['seq']:.2f}x, windows {d1 / med['window']:.2f}x")
        print(f"floor shuffled / sequential: {med['seq'] / best:.2f}; astream shuffled / unshuffled: {a0 / a1:.2f}; "
              f"astream over the floor: unshuffled {a0 / med['seq']:.2f}x, shuffled {a1 / best:.2f}x")


if __name__ == "__main__":
    main()
