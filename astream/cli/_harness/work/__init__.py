"""What a benchmark's fresh process runs: the workloads, in any library's interpreter.

This package is loaded two ways. The driver imports it as ``astream.cli._harness.work``
(to name a workload); a measured child loads it by path under the name ``_bench_work``
(:data:`BOOT`), so that it runs in an interpreter with astream from another checkout, or
with no astream at all (a peer's venv: mosaicml-streaming, LitData, Hugging Face
``datasets``, ``webdataset``). Hence its rules: the standard library only at import time,
each library imported inside the workload that uses it, and only astream's public API.

A workload is a function ``f(**params) -> dict`` of a module here (``mds``, ``formats``);
:func:`main` calls it and prints its result as one JSON line after :data:`MARK`, with the
process's own CPU seconds and the file astream was imported from (``code``), which the
driver checks against the checkout it meant to run.
"""

from __future__ import annotations

import importlib
import json
import os
import resource
import sys
import time
from typing import Any

MARK = "@@bench-result "

# Run as ``python -c BOOT DIR MODULE FUNCTION PARAMS_JSON``: this package from DIR under a
# name no installed package has, whatever astream (if any) the interpreter imports.
BOOT = (
    "import importlib.util as u, sys\n"
    "s = u.spec_from_file_location('_bench_work', sys.argv[1] + '/__init__.py', "
    "submodule_search_locations=[sys.argv[1]])\n"
    "m = u.module_from_spec(s); sys.modules['_bench_work'] = m; s.loader.exec_module(m)\n"
    "m.main(sys.argv[2:])\n"
)

BATCH = 32
RESUME_AT = 0.9


def length(batch: Any) -> int:
    """Samples in a batch of any library (a dict of columns, a tensor, a list)."""
    if isinstance(batch, dict):
        return length(next(iter(batch.values())))
    if hasattr(batch, "shape"):
        return int(batch.shape[0])
    return len(batch)


def cpu_s() -> float:
    """User + system CPU seconds of this process (all its threads) so far."""
    usage = resource.getrusage(resource.RUSAGE_SELF)
    return usage.ru_utime + usage.ru_stime


def tree_cpu_s(root: int | None = None) -> float:
    """CPU seconds so far of a process and its live descendants (loader workers, a
    forkserver, a node agent it started), read from ``/proc``; 0 where there is none."""
    root = os.getpid() if root is None else root
    parent: dict[int, int] = {}
    cpu: dict[int, float] = {}
    tick = os.sysconf("SC_CLK_TCK")
    for entry in os.listdir("/proc") if os.path.isdir("/proc") else ():
        if entry.isdigit():
            try:
                with open(f"/proc/{entry}/stat") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            parent[int(entry)] = int(fields[1])
            cpu[int(entry)] = (int(fields[11]) + int(fields[12])) / tick
    mine, grew = {root}, True
    while grew:
        grew = False
        for pid, ppid in parent.items():
            if ppid in mine and pid not in mine:
                mine.add(pid)
                grew = True
    return sum(cpu.get(pid, 0.0) for pid in mine)


def stub_streaming_vision() -> None:
    """mosaicml-streaming's ``__init__`` imports ``streaming.vision``, which needs torchvision
    (not installed beside CPU torch, docs/bench/peer.md): an empty package stands in for it."""
    import types

    stub = types.ModuleType("streaming.vision")
    stub.__path__ = []
    sys.modules.setdefault("streaming.vision", stub)


def astream_code() -> str | None:
    """The checkout (the folder holding the ``astream`` package) this process imported, if any."""
    module = sys.modules.get("astream")
    path = getattr(module, "__file__", None)
    return os.path.dirname(os.path.dirname(os.path.realpath(path))) if path else None


def main(argv: list[str]) -> None:
    """Run ``argv = [module, function, params_json]`` and print the result after :data:`MARK`."""
    module, function, params = argv
    import warnings

    warnings.simplefilter("ignore")  # a peer's deprecation chatter is not a result
    started = time.perf_counter()
    work = importlib.import_module(f"{__name__}.{module}")
    result: dict[str, Any] = getattr(work, function)(**json.loads(params))
    result.setdefault("wall_s", time.perf_counter() - started)
    result["self_cpu_s"] = cpu_s()
    result["code"] = astream_code()
    sys.stdout.write(MARK + json.dumps(result) + "\n")
    sys.stdout.flush()
