"""One simulated accelerator of benchmarks/au_bench.py: a rank that sleeps a step time per batch.

Runs in astream's interpreter (``--lib astream``) or the peer's (``--lib mosaic``:
mosaicml-streaming 0.13 + torch ``DataLoader``, no astream import). Its place in the job
comes from ``RANK``/``WORLD_SIZE``/``LOCAL_RANK``/``LOCAL_WORLD_SIZE`` (both libraries read
them). It iterates ``--steps`` batches (at most one epoch), sleeping ``--step-time`` after
each (the accelerator's compute), and writes as JSON: the wait of each ``next()``, the
compute time, the wall time from the first batch to the end, and the CPU seconds its
process tree (loader workers included) spent meanwhile.

With ``--resume`` it instead measures resumption: iterate to 90% of the epoch, take the
loader's state dict, build a fresh dataset and loader, load the state and time the first
batch.
"""

from __future__ import annotations

import argparse
import json
import os
import time
import warnings
from typing import Any

from peer_stub import stub_streaming_vision


def make(lib: str, remote: str | None, local: str, batch: int, workers: int) -> tuple[Any, Any]:
    if lib == "astream":
        from astream import Loader, StreamingDataset

        ds = StreamingDataset(remote=remote, local=local, batch_size=batch, shuffle=True)
        return ds, Loader(ds, num_workers=workers)
    stub_streaming_vision()
    from streaming import StreamingDataLoader, StreamingDataset

    ds = StreamingDataset(remote=remote, local=local, batch_size=batch, shuffle=True)
    return ds, StreamingDataLoader(ds, batch_size=batch, num_workers=workers)


def tree_cpu() -> float:
    """CPU seconds so far of this process and its live descendants (loader workers, a
    forkserver, a node agent started here), read from /proc."""
    parent: dict[int, int] = {}
    cpu: dict[int, float] = {}
    tick = os.sysconf("SC_CLK_TCK")
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        parent[int(entry)] = int(fields[1])
        cpu[int(entry)] = (int(fields[11]) + int(fields[12])) / tick
    mine, total = {os.getpid()}, 0.0
    grew = True
    while grew:
        grew = False
        for pid, ppid in parent.items():
            if ppid in mine and pid not in mine:
                mine.add(pid)
                grew = True
    for pid in mine:
        total += cpu.get(pid, 0.0)
    return total


def wait_for_all(folder: str) -> None:
    """Every accelerator starts its measured steps together, once all have their first batch
    (as MLPerf Storage starts them): no rank's steps overlap another's start-up."""
    world = int(os.environ.get("WORLD_SIZE", "1"))
    open(os.path.join(folder, f"ready.{os.environ.get('RANK', '0')}"), "w").close()
    while sum(1 for name in os.listdir(folder) if name.startswith("ready.")) < world:
        time.sleep(0.005)


def accelerate(args: argparse.Namespace) -> dict[str, Any]:
    ds, loader = make(args.lib, args.remote, args.local, args.batch, args.workers)
    steps = min(args.steps, len(loader))
    waits = []
    it = iter(loader)
    first = time.perf_counter()
    next(it)
    first_batch = time.perf_counter() - first
    if args.barrier:
        wait_for_all(args.barrier)
    cpu0 = tree_cpu()
    start = time.perf_counter()
    compute = 0.0
    for _ in range(steps - 1):
        asked = time.perf_counter()
        next(it)
        slept = time.perf_counter()
        waits.append(slept - asked)
        time.sleep(args.step_time)
        compute += time.perf_counter() - slept  # the step as long as it took (a loaded machine oversleeps)
    wall = time.perf_counter() - start
    cpu = tree_cpu() - cpu0
    del it
    if args.lib == "astream":
        loader.close()
        ds.close()
    return {"steps": steps, "waits": waits, "compute_s": compute, "wall_s": wall,
            "first_batch_s": first_batch, "samples": (steps - 1) * args.batch, "cpu_s": cpu}


def resume(args: argparse.Namespace) -> dict[str, Any]:
    ds, loader = make(args.lib, args.remote, args.local, args.batch, args.workers)
    stop = int(len(loader) * 0.9)
    it = iter(loader)
    for _ in range(stop):
        next(it)
    state = loader.state_dict()
    del it
    if args.lib == "astream":
        loader.close()
        ds.close()
    start = time.perf_counter()
    ds2, loader2 = make(args.lib, args.remote, args.local, args.batch, args.workers)
    loader2.load_state_dict(state)
    next(iter(loader2))
    took = time.perf_counter() - start
    if args.lib == "astream":
        loader2.close()
        ds2.close()
    return {"resume_s": took, "at_batch": stop, "of": len(loader)}


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--lib", choices=("astream", "mosaic"), required=True)
    p.add_argument("--remote", default=None)
    p.add_argument("--local", required=True)
    p.add_argument("--batch", type=int, required=True)
    p.add_argument("--workers", type=int, default=1)
    p.add_argument("--steps", type=int, default=100)
    p.add_argument("--step-time", type=float, required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--resume", action="store_true")
    p.add_argument("--barrier", default=None, help="a folder the ranks meet in after their first batch")
    args = p.parse_args()
    warnings.simplefilter("ignore")
    result = resume(args) if args.resume else accelerate(args)
    with open(args.out, "w") as f:
        json.dump({"rank": int(os.environ.get("RANK", "0")), **result}, f)


if __name__ == "__main__":
    main()
