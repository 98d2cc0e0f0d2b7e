"""Many epochs through worker processes hold nothing that only the garbage collector frees.

Before: each epoch of ``Loader(num_workers=2)`` left dozens of file descriptors (the shard
maps of the stand-ins' dataset copies) until a collection happened to run; a 100-epoch job
could run out of descriptors.
"""

from __future__ import annotations

import gc
import os
from pathlib import Path

import pytest

from astream import Loader, MDSWriter, StreamingDataset

N = 600


def _fds() -> int:
    return len(os.listdir("/proc/self/fd"))


def _maps(root: Path) -> int:
    """Memory maps of this process onto the dataset's files."""
    with open("/proc/self/maps") as f:
        return sum(str(root) in line for line in f)


def _rss_mb() -> float:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE") / 2**20


@pytest.mark.slow
@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts descriptors through /proc")
def test_a_hundred_epochs_with_workers_stay_flat(tmp_path: Path) -> None:
    root = tmp_path / "ds"
    with MDSWriter(out=str(root), columns={"id": "int64", "p": "bytes"}, size_limit="16kb") as writer:
        for i in range(N):
            writer.write({"id": i, "p": bytes([i % 256]) * 900})
    ds = StreamingDataset(local=str(root), batch_size=16)
    try:
        with Loader(ds, num_workers=2) as warm:  # the forkserver and the node agent start here
            assert sum(len(b["id"]) for b in warm) == N
        # Loaders of earlier tests kept alive by reference cycles (a traceback) hold their
        # persistent workers until collected: collect them now, not during the count.
        gc.collect()
        gc.disable()  # descriptors and maps may not depend on a collection running
        try:
            before = (_fds(), _maps(root))
            loader = Loader(ds, num_workers=2)
            held = []
            for _ in range(30):
                assert sum(len(b["id"]) for b in loader) == N
                held.append((_fds(), _maps(root)))
            loader.close()
            after = (_fds(), _maps(root))
        finally:
            gc.enable()
        (fds2, maps2) = held[2]
        assert max(f for f, _ in held[2:]) <= fds2 * 1.1, f"descriptors grew over epochs: {held[::5]}"
        assert max(m for _, m in held[2:]) <= maps2 * 1.1 + 1, f"shard maps grew over epochs: {held[::5]}"
        # At most: node agents of earlier tests' datasets may shut down meanwhile (they
        # linger after their last client), which closes descriptors of theirs.
        msg = f"(descriptors, maps) {before} before the loader, {after} after close()"
        assert after[0] <= before[0], msg
        assert after[1] == before[1], msg
        loader = Loader(ds, num_workers=2)
        rss = []
        for _ in range(100):
            assert sum(len(b["id"]) for b in loader) == N
            rss.append(_rss_mb())
        loader.close()
        assert max(rss[2:]) <= rss[2] * 1.1, f"RSS grew over epochs (MB): {rss[::10]}"
    finally:
        ds.close()
