"""The streaming half of ``astream demo``: HTTP, shuffling, a mid-epoch stop, resumption.

The dataset the first half wrote is served over HTTP on 127.0.0.1, streamed shuffled
through a ``Loader`` with two worker processes, stopped part-way, and its state saved
to a file; a *new process* with one worker resumes from that file. The demo then
checks that the two runs together saw every sample exactly once.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import time

from tqdm import tqdm

from astream._dataset.dataset import StreamingDataset
from astream._dataset.loader import Loader
from astream.testing import LoopbackServer

BATCH = 16
SEED = 2024


def _loader(remote: str, cache: str, workers: int) -> tuple[StreamingDataset, Loader]:
    ds = StreamingDataset(remote=remote, local=cache, shuffle=True, shuffle_seed=SEED, batch_size=BATCH)
    return ds, Loader(ds, num_workers=workers)


def run_stream_demo(dataset_dir: str, work_dir: str) -> int:
    """Serve ``dataset_dir``, stream it, stop mid-epoch, resume in another process, verify."""
    cache = os.path.join(work_dir, "cache")
    # Each run writes the dataset anew and serves it on a new port: the last run's cache is
    # another remote's, which a folder refuses (one remote per cache folder), so it goes.
    shutil.rmtree(cache, ignore_errors=True)
    state_file = os.path.join(work_dir, "state.json")
    seen_file = os.path.join(work_dir, "resumed-ids.json")
    with LoopbackServer(dataset_dir) as server:
        print(f"\n  serving {dataset_dir} at {server.url}")
        ds, loader = _loader(server.url, cache, workers=2)
        total = len(loader)
        stop_after = total * 2 // 5
        seen: list[int] = []
        start = time.perf_counter()
        first_batch = None
        with tqdm(total=total, desc="  epoch 0 (2 workers)", unit="batch", leave=True) as bar:
            for n, batch in enumerate(loader, start=1):
                if first_batch is None:
                    first_batch = time.perf_counter() - start
                seen.extend(int(i) for i in batch["id"])
                bar.update(1)
                if n == stop_after:
                    break
        state = loader.state_dict()
        ds.close()
        with open(state_file, "w") as f:
            json.dump(state, f)
        print(f"  stopped after {stop_after} of {total} batches ({len(seen)} samples, first batch after "
              f"{first_batch or 0:.2f} s); state saved to {state_file}:\n    {state}")
        print("  resuming in a new process with 1 worker ...")
        child = subprocess.run(
            [sys.executable, "-m", "astream.cli._demo_stream", "--remote", server.url, "--cache", cache,
             "--state", state_file, "--out", seen_file],
            check=False,
        )
        if child.returncode != 0:
            print(f"  the resumed process failed (exit code {child.returncode})")
            return 1
    with open(seen_file) as f:
        rest: list[int] = json.load(f)
    union = seen + rest
    expected = set(range(ds.size))
    repeated = len(union) - len(set(union))
    missing = expected - set(union)
    print(f"  first run {len(seen)} + resumed run {len(rest)} = {len(union)} samples; "
          f"{len(missing)} missing, {repeated} repeated")
    ok = not missing and not repeated
    print("  resumption " + ("verified: every sample exactly once" if ok else "FAILED"))
    return 0 if ok else 1


def _resume(argv: list[str]) -> int:
    parser = argparse.ArgumentParser(prog="python -m astream.cli._demo_stream")
    parser.add_argument("--remote", required=True)
    parser.add_argument("--cache", required=True)
    parser.add_argument("--state", required=True)
    parser.add_argument("--out", required=True)
    args = parser.parse_args(argv)
    ds, loader = _loader(args.remote, args.cache, workers=1)
    with open(args.state) as f:
        loader.load_state_dict(json.load(f))
    ids: list[int] = []
    with tqdm(desc="  epoch 0, resumed (1 worker)", unit="batch") as bar:
        for batch in loader:
            ids.extend(int(i) for i in batch["id"])
            bar.update(1)
    ds.close()
    with open(args.out, "w") as f:
        json.dump(ids, f)
    return 0


if __name__ == "__main__":
    sys.exit(_resume(sys.argv[1:]))
