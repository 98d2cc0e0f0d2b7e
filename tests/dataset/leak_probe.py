"""Run by test_epochs_leak.py in a process of its own: counts what many epochs hold.

A pytest process has other tests' threads and agents winding down around it; a fresh
process counts only what this loader holds. Prints one JSON line.
"""

from __future__ import annotations

import gc
import json
import os
import sys
from pathlib import Path

from astream import Loader, StreamingDataset


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _maps(root: Path) -> int:
    with open("/proc/self/maps") as f:
        return sum(str(root) in line for line in f)


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


def main(root: Path, samples: int) -> dict[str, object]:
    ds = StreamingDataset(local=str(root), batch_size=16)
    try:
        with Loader(ds, num_workers=2) as warm:  # the forkserver and the node agent start here
            assert sum(len(b["id"]) for b in warm) == samples
        gc.disable()  # descriptors and maps may not depend on a collection running
        try:
            before = [_fds(), _maps(root)]
            loader = Loader(ds, num_workers=2)
            held = []
            for _ in range(30):
                assert sum(len(b["id"]) for b in loader) == samples
                held.append([_fds(), _maps(root)])
            loader.close()
            after = [_fds(), _maps(root)]
        finally:
            gc.enable()
        loader = Loader(ds, num_workers=2)
        rss = []
        for _ in range(100):
            assert sum(len(b["id"]) for b in loader) == samples
            rss.append(_rss_mb())
        loader.close()
    finally:
        ds.close()
    return {"before": before, "held": held, "after": after, "rss": rss}


if __name__ == "__main__":
    print(json.dumps(main(Path(sys.argv[1]), int(sys.argv[2]))))
