"""How worker processes start: the forkserver, started early, and scripts without a main guard.

Workers start with ``forkserver`` (``spawn`` where it is missing), and both re-import
the script's ``__main__`` in the new interpreter (the forkserver once, each worker
again) so that functions defined there unpickle. A script that iterates a loader at
its top level, without ``if __name__ == "__main__":`` (common in MosaicML scripts: on
Linux torch's DataLoader forks, which re-imports nothing), would then run its own top
level again in every child, and multiprocessing stops it with "An attempt has been
made to start a new process before the current process has finished its bootstrapping
phase", once per process.

:func:`decide_start` is called where the user's code is on the stack (``Loader``'s
construction). It finds the top-level statement of ``__main__`` that is running and
reads the script's source to see whether that statement is inside a main guard; no
guessing from names. When it is not:

- what the workers need (the dataset, transforms, collate function) does not refer to
  ``__main__``: the workers start without re-importing it (``__main__`` is left out of
  the forkserver's preloads and of the preparation data of a process that starts), so
  the script runs, as it would with a fork;
- it does refer to ``__main__`` (a transform defined in the script): a
  :class:`ConfigError` before any process starts, with the two-line fix.

A guarded script is re-imported only if the workers need something defined in it too:
otherwise the forkserver's start would import it, and all it imports (a training
script: its framework and model code), for nothing the workers use.
"""

from __future__ import annotations

import ast
import contextlib
import multiprocessing as mp
import sys
import threading
from collections.abc import Iterator
from dataclasses import dataclass
from types import FrameType, ModuleType

from astream.errors import ConfigError

__all__ = ["WorkerStart", "decide_start", "hidden_main", "prestart", "unguarded_line"]

_MAIN_LOCK = threading.Lock()  # one process start at a time: the preparation-data wrapper is process-wide


@dataclass(frozen=True)
class WorkerStart:
    """How this loader's worker processes start.

    ``import_main``: children re-import ``__main__`` (the script guards its top level,
    or there is no script file to re-run).
    """

    import_main: bool = True


def _is_main_guard(node: ast.stmt) -> bool:
    if not isinstance(node, ast.If) or not isinstance(node.test, ast.Compare):
        return False
    test = node.test
    if len(test.ops) != 1 or not isinstance(test.ops[0], ast.Eq):
        return False
    sides = [test.left, test.comparators[0]]
    names = [s for s in sides if isinstance(s, ast.Name) and s.id == "__name__"]
    mains = [s for s in sides if isinstance(s, ast.Constant) and s.value == "__main__"]
    return len(names) == 1 and len(mains) == 1


def _main_module_frame(frame: FrameType | None, main: ModuleType) -> FrameType | None:
    """The outermost frame on the stack running ``main``'s module-level code."""
    found = None
    while frame is not None:
        if frame.f_globals is main.__dict__ and frame.f_code.co_name == "<module>":
            found = frame
        frame = frame.f_back
    return found


def unguarded_line(frame: FrameType | None = None) -> int | None:
    """The line of ``__main__`` that a child's re-import would run again, or None.

    None when ``__main__`` is not running its top level now (an interactive session,
    a function called later, a notebook), has no source to re-run, or runs it inside
    ``if __name__ == "__main__":``.
    """
    main = sys.modules.get("__main__")
    path = getattr(main, "__file__", None)
    if main is None or not isinstance(path, str):
        return None  # no file: multiprocessing re-imports nothing
    top = _main_module_frame(frame if frame is not None else sys._getframe(1), main)
    if top is None:
        return None
    line = top.f_lineno
    try:
        with open(path, "rb") as f:
            tree = ast.parse(f.read(), filename=path)
    except (OSError, SyntaxError, ValueError):
        return line  # cannot tell: assume the worst, the caller decides what that costs
    for node in tree.body:
        end = getattr(node, "end_lineno", None) or node.lineno
        if node.lineno <= line <= end:
            return None if _is_main_guard(node) else line
    return line


def decide_start(payload: bytes, frame: FrameType | None = None) -> WorkerStart:
    """How workers that get ``payload`` (the pickled job parts) start from here.

    Raises:
        ConfigError: the script runs this at its top level without a main guard and the
            workers need something defined in it.
    """
    line = unguarded_line(frame if frame is not None else sys._getframe(1))
    if line is None:
        # A guarded script (or none): the workers re-import it only if they need something
        # defined in it. Otherwise the forkserver would import it, and everything it imports
        # (a training script: torch, the model's code), in its start before the first
        # worker: seconds and hundreds of MB for nothing the workers use.
        return WorkerStart(import_main=b"__main__" in payload)
    if b"__main__" in payload:
        main = sys.modules["__main__"]
        raise ConfigError(
            f"{getattr(main, '__file__', '__main__')}, line {line}: this script starts loader worker "
            "processes at its top level, and the workers need something defined in it (a transform, "
            "collate_fn or dataset class), so each would re-run the script. Put the script's top level "
            "under a main guard:\n\n    if __name__ == \"__main__\":\n        main()\n\n"
            "or define those functions in a module of their own, or use num_workers=0"
        )
    return WorkerStart(import_main=False)


def process_context(preload: str | None, start: WorkerStart) -> mp.context.BaseContext:
    """The multiprocessing context workers start with, preloading module ``preload``."""
    methods = mp.get_all_start_methods()
    if "forkserver" not in methods:
        return mp.get_context("spawn")
    ctx = mp.get_context("forkserver")
    from multiprocessing import forkserver

    server = getattr(forkserver, "_forkserver", None)
    current = list(getattr(server, "_preload_modules", None) or ["__main__"])
    if not start.import_main:
        current = [m for m in current if m != "__main__"]
    wanted = current if preload is None or preload in current else [*current, preload]
    if wanted != getattr(server, "_preload_modules", None):
        # Takes effect when the forkserver starts (the first time any forkserver process
        # starts here, or prestart()).
        with contextlib.suppress(Exception):
            ctx.set_forkserver_preload(wanted)
    return ctx


# Seconds after ``Loader()`` the forkserver starts unless an iteration began first. On two
# cores an interpreter starting at once took the CPU from the first batch (warm first batch
# with 2 workers 13 -> 35 ms); a caller that builds its model first still finds it warm.
PRESTART_DELAY = 0.25


def prestart(ctx: mp.context.BaseContext, delay: float = PRESTART_DELAY) -> threading.Timer | None:
    """Start the forkserver ``delay`` seconds from now, in a thread: its interpreter start and
    imports (the largest part of a first worker's start) overlap the caller's own set-up.
    Returns the timer, to cancel when an iteration begins before it fires (the pool then
    starts the processes once the stand-ins' first batch is on its way)."""
    if ctx.get_start_method() != "forkserver":
        return None
    from multiprocessing import forkserver

    def run() -> None:
        with contextlib.suppress(Exception):  # a failure shows again, named, at the first start
            forkserver.ensure_running()

    timer = threading.Timer(delay, run)
    timer.name, timer.daemon = "astream-forkserver-start", True
    timer.start()
    return timer


@contextlib.contextmanager
def hidden_main(start: WorkerStart) -> Iterator[None]:
    """While a process starts: keep ``__main__`` out of its preparation data if needed.

    By leaving the script's path and module name out of what multiprocessing sends the
    child (``spawn.get_preparation_data``), not by touching ``__main__``: the script's
    own code may read its globals (``__file__``) at that moment, from another thread.
    """
    if start.import_main:
        with _MAIN_LOCK:  # not while another loader's start has the wrapper in place
            yield
        return
    from multiprocessing import spawn

    with _MAIN_LOCK:
        original = spawn.get_preparation_data

        def without_main(name: str) -> dict[str, object]:
            data: dict[str, object] = original(name)
            data.pop("init_main_from_path", None)
            data.pop("init_main_from_name", None)
            return data

        spawn.get_preparation_data = without_main
        try:
            yield
        finally:
            spawn.get_preparation_data = original
