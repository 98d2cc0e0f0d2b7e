"""Fresh-process runs: a workload in a new interpreter, with the CPU and peak RSS of its
process tree and the machine's load around it; and which checkout's astream it imports.

A child is ``python -c BOOT <work dir> MODULE FUNCTION PARAMS`` (:mod:`.work`): the workload
code always comes from this checkout (the driver's), the code under test from the checkout
its environment puts first (:func:`code_env`), or from a peer's interpreter.
"""

from __future__ import annotations

import json
import os
import subprocess
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from astream.cli._harness import work
from astream.cli._output import CommandError

__all__ = ["WORK_DIR", "ChildFailed", "code_env", "run_children"]

WORK_DIR = str(Path(work.__file__).resolve().parent)
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
_TICK = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100


class ChildFailed(CommandError):
    """A measured child exited with an error (its stderr's end is in the message)."""


def code_env(env: dict[str, str], root: str | None, pycache: str | None) -> dict[str, str]:
    """``env`` for a child whose ``astream`` comes from the checkout ``root`` (None: a peer's
    interpreter, no astream put on its path).

    The checkout goes first on ``PYTHONPATH`` and is the child's working directory too: the
    forkserver that starts loader workers imports astream with a path of its own, which
    begins with the working directory (run from another checkout, a base child's workers
    ran that checkout's code). Bytecode is cached (outside the checkouts) as an installed
    package has it: a machine that sets PYTHONDONTWRITEBYTECODE would make every fresh
    process, and every worker, compile astream from source.
    """
    out = dict(env)
    out.pop("PYTHONDONTWRITEBYTECODE", None)
    if pycache:
        out["PYTHONPYCACHEPREFIX"] = pycache
    if root is not None:
        rest = out.get("PYTHONPATH", "")
        out["PYTHONPATH"] = root + (os.pathsep + rest if rest else "")
    return out


def _tree(roots: Sequence[int]) -> dict[int, tuple[int, float]]:
    """``pid -> (RSS bytes, CPU seconds)`` of the processes under ``roots`` (``/proc``)."""
    out: dict[int, tuple[int, float]] = {}
    todo = list(roots)
    while todo:
        pid = todo.pop()
        if pid in out:
            continue
        try:
            with open(f"/proc/{pid}/statm") as fh:
                rss = int(fh.read().split()[1]) * _PAGE
            with open(f"/proc/{pid}/stat") as fh:
                fields = fh.read().rsplit(")", 1)[1].split()
            out[pid] = (rss, (int(fields[11]) + int(fields[12])) / _TICK)
            for task in os.listdir(f"/proc/{pid}/task"):
                with open(f"/proc/{pid}/task/{task}/children") as fh:
                    todo.extend(int(c) for c in fh.read().split())
        except (OSError, ValueError, IndexError):
            continue
    return out


class _Watch:
    """Polls a process tree every 20 ms: the peak of its summed RSS, each process's last CPU."""

    def __init__(self, pids: Sequence[int]) -> None:
        self.pids = list(pids)
        self.peak = 0
        self.cpu: dict[int, float] = {}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._poll, daemon=True)
        self._thread.start()

    def _poll(self) -> None:
        while not self._stop.is_set():
            tree = _tree(self.pids)
            self.peak = max(self.peak, sum(rss for rss, _ in tree.values()))
            for pid, (_, cpu) in tree.items():
                self.cpu[pid] = max(cpu, self.cpu.get(pid, 0.0))
            self._stop.wait(0.02)

    def stop(self) -> None:
        self._stop.set()
        self._thread.join()


def _parse(out: str, err: str, what: str, code: int) -> dict[str, Any]:
    lines = [line for line in out.splitlines() if line.startswith(work.MARK)]
    # Some peers' interpreters abort on the way out (a native thread at shutdown) after the
    # result line: the line counts, the exit code does not.
    if not lines:
        tail = (err.strip() or out.strip())[-3000:]
        last = tail.splitlines()[-1] if tail else "no output"
        raise ChildFailed(f"{what} failed (exit {code}): {last}\n{tail}")
    got: dict[str, Any] = json.loads(lines[-1][len(work.MARK):])
    return got


def run_children(python: str, module: str, function: str, params: dict[str, Any], envs: Sequence[dict[str, str]],
                 cwd: str, what: str, timeout: float = 1800.0) -> tuple[list[dict[str, Any]], dict[str, float]]:
    """One workload in ``len(envs)`` fresh processes started together (the ranks of a node,
    or one process): each one's result, and the tree's figures: ``wall_s`` (from the first
    start to the last exit), ``cpu_s`` (every process of the tree, polled every 20 ms),
    ``peak_rss_mb`` (summed over the tree) and ``load`` (the 1-minute load average, the mean
    of before and after)."""
    load = os.getloadavg()[0]
    cmd = [python, "-c", work.BOOT, WORK_DIR, module, function, json.dumps(params)]
    start = time.perf_counter()
    procs = [subprocess.Popen(cmd, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
             for env in envs]
    watch = _Watch([p.pid for p in procs])
    results = []
    try:
        for i, proc in enumerate(procs):
            out, err = proc.communicate(timeout=timeout)
            label = what if len(procs) == 1 else f"{what} (rank {i})"
            results.append(_parse(out, err, label, proc.returncode))
    finally:
        watch.stop()
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait()
    wall = time.perf_counter() - start
    cpu = dict(watch.cpu)
    for proc, res in zip(procs, results, strict=True):  # the last 20 ms of each child, from itself
        cpu[proc.pid] = max(cpu.get(proc.pid, 0.0), float(res.get("self_cpu_s", 0.0)))
    figures = {"wall_s": wall, "cpu_s": sum(cpu.values()), "peak_rss_mb": watch.peak / 1e6,
               "load": (load + os.getloadavg()[0]) / 2}
    return results, figures
