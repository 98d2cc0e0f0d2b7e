"""``astream demo``: write a small MDS dataset, show what is in it, and read it back."""

from __future__ import annotations

import os
import time

import numpy as np

from astream._format.local import LocalDataset
from astream._format.writer import MDSWriter

NUM_SAMPLES = 1000
COLUMNS = {"id": "int", "caption": "str", "image": "ndarray:uint8:8,8,3", "embedding": "ndarray:float32"}
WORDS = ["alpha", "beta", "gamma", "delta", "epsilon", "zeta", "eta", "theta", "iota", "kappa", "lambda", "mu"]


def _sample(i: int) -> dict[str, object]:
    rng = np.random.default_rng(i)
    return {
        "id": i,
        "caption": " ".join(rng.choice(WORDS, size=1 + i % 6)),
        "image": rng.integers(0, 256, (8, 8, 3), dtype=np.uint8),
        "embedding": rng.standard_normal(1 + i % 16).astype(np.float32),
    }


def _size(n: float) -> str:
    for unit in ("B", "KiB", "MiB", "GiB"):
        if n < 1024 or unit == "GiB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n} B"


def run_demo(directory: str) -> int:
    """Write ``NUM_SAMPLES`` synthetic samples to ``directory``, describe them, read them back.

    Returns:
        0 when every sample read back equals what was written, 1 otherwise.
    """
    out = os.path.join(directory, "demo-mds")
    print(f"astream demo: writing {NUM_SAMPLES} samples to {out}")
    start = time.perf_counter()
    with MDSWriter(out, COLUMNS, compression="zstd", hashes=["xxh64"], size_limit="32kb", exist_ok=True) as writer:
        for i in range(NUM_SAMPLES):
            writer.write(_sample(i))
    wrote = time.perf_counter() - start

    with LocalDataset(out, validate_hash="xxh64") as ds:
        shards = ds.index.shards
        raw = sum(s.raw_data.bytes for s in shards)
        stored = sum(s.stored.bytes for s in shards)
        print(f"  wrote {len(ds)} samples in {wrote:.2f} s: {len(shards)} shards, "
              f"{_size(raw)} raw, {_size(stored)} on disk (zstd, {raw / max(stored, 1):.1f}x)")
        print("\n  column      encoding               size")
        for name, encoding in ds.columns.items():
            size = shards[0].column_sizes[shards[0].column_names.index(name)]
            print(f"  {name:<11} {encoding:<22} {'variable' if size is None else f'{size} bytes'}")
        print("\n  shard                 samples        raw    on disk")
        for info in shards[:3]:
            print(f"  {info.stored.basename:<21} {info.samples:>7} {_size(info.raw_data.bytes):>10} {_size(info.stored.bytes):>10}")
        if len(shards) > 3:
            print(f"  ... {len(shards) - 3} more")

        first = ds[0]
        print(f"\n  sample 0: id={first['id']} caption={first['caption']!r} "
              f"image={first['image'].dtype}{list(first['image'].shape)} "
              f"embedding={first['embedding'].dtype}{list(first['embedding'].shape)}")

        start = time.perf_counter()
        mismatches = [i for i in range(len(ds)) if not _equal(ds[i], _sample(i))]
        batch = ds.get_batch(np.arange(len(ds)))
        read = time.perf_counter() - start
        if not np.array_equal(batch["image"], np.stack([_sample(i)["image"] for i in range(len(ds))])):  # type: ignore[misc]
            mismatches.append(-1)
        print(f"  read every sample back (one by one, then as one batch) in {read:.2f} s: "
              + ("all equal" if not mismatches else f"{len(mismatches)} DIFFER"))
    if mismatches:
        return 1
    from astream.cli._demo_stream import run_stream_demo

    return run_stream_demo(out, directory)


def _equal(read: dict[str, object], written: dict[str, object]) -> bool:
    return read.keys() == written.keys() and all(
        np.array_equal(read[k], written[k]) if isinstance(written[k], np.ndarray) else read[k] == written[k]  # type: ignore[arg-type]
        for k in written
    )
