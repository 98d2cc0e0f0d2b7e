"""Many epochs through worker processes hold nothing that only the garbage collector frees.

Before: each epoch of ``Loader(num_workers=2)`` left dozens of file descriptors (the shard
maps of the stand-ins' dataset copies) until a collection happened to run; a 100-epoch job
could run out of descriptors. The counting runs in a process of its own (leak_probe.py).
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from astream import MDSWriter

N = 600


@pytest.mark.slow
@pytest.mark.timeout(180)
@pytest.mark.skipif(not os.path.isdir("/proc/self/fd"), reason="counts descriptors through /proc")
def test_a_hundred_epochs_with_workers_stay_flat(tmp_path: Path) -> None:
    root = tmp_path / "ds"
    with MDSWriter(out=str(root), columns={"id": "int64", "p": "bytes"}, size_limit="16kb") as writer:
        for i in range(N):
            writer.write({"id": i, "p": bytes([i % 256]) * 900})
    probe = Path(__file__).with_name("leak_probe.py")
    out = subprocess.run([sys.executable, str(probe), str(root), str(N)], capture_output=True, text=True,
                         timeout=170, check=False)
    assert out.returncode == 0, out.stderr[-3000:]
    result = json.loads(out.stdout.strip().splitlines()[-1])
    held, rss = result["held"], result["rss"]
    fds2, maps2 = held[2]
    assert max(f for f, _ in held[2:]) <= fds2 * 1.1, f"descriptors grew over epochs: {held[::5]}"
    assert max(m for _, m in held[2:]) <= maps2 * 1.1 + 1, f"shard maps grew over epochs: {held[::5]}"
    (fds_before, maps_before), (fds_after, maps_after) = result["before"], result["after"]
    msg = f"(descriptors, maps) {result['before']} before the loader, {result['after']} after close()"
    # At most as many: the node agent's own sockets may close meanwhile, never more.
    assert fds_after <= fds_before, msg
    assert maps_after == maps_before, msg
    # 10% and a few MB: the allocator's arenas settle over the first epochs on a busy machine.
    assert max(rss[2:]) <= rss[2] * 1.1 + 5, f"RSS grew over epochs (MB): {rss[::10]}"
