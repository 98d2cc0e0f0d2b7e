"""Helpers of the hostile-input tests: small tars, and a child process run under a memory
cap (``RLIMIT_AS``), as the audit of issue 32 ran its cases."""

from __future__ import annotations

import io
import os
import subprocess
import sys
import tarfile
import textwrap
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def small_tar(members: dict[str, bytes]) -> bytes:
    """A plain tar holding ``members`` (name -> body)."""
    out = io.BytesIO()
    with tarfile.open(fileobj=out, mode="w") as tar:
        for name, body in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(body)
            tar.addfile(info, io.BytesIO(body))
    return out.getvalue()


def run_capped(setup: str, action: str, cap_mb: int = 64, timeout: float = 120) -> tuple[str, str]:
    """Run ``action`` in a child Python whose address space is capped at its baseline + ``cap_mb``.

    ``setup`` runs first, uncapped (imports, files, objects, threads); the baseline is the
    child's virtual size after it. ``action`` must raise an ``AstreamError``.

    Returns:
        (outcome, message): outcome ``"astream"`` with the error's class and message, or
        ``"memory"`` (MemoryError: the cap was hit), ``"none"`` (nothing raised) or
        ``"other"`` (another exception, its repr as message).
    """
    script = "\n".join([
        "import resource, sys",
        "from astream.errors import AstreamError",
        textwrap.dedent(setup),
        "def _vm():",
        "    with open('/proc/self/status') as fh:",
        "        return next(int(l.split()[1]) << 10 for l in fh if l.startswith('VmSize:'))",
        f"resource.setrlimit(resource.RLIMIT_AS, (_vm() + ({cap_mb} << 20), resource.RLIM_INFINITY))",
        "try:",
        textwrap.indent(textwrap.dedent(action), "    "),
        "except AstreamError as exc:",
        "    print('OUTCOME astream', type(exc).__name__, exc)",
        "except MemoryError:",
        "    print('OUTCOME memory')",
        "except BaseException as exc:",
        "    print('OUTCOME other', repr(exc))",
        "else:",
        "    print('OUTCOME none')",
    ])
    # One malloc arena and one BLAS thread: what the child holds is what the action costs.
    env = {**os.environ, "PYTHONPATH": str(REPO), "MALLOC_ARENA_MAX": "1", "OPENBLAS_NUM_THREADS": "1",
           "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=timeout,
                          env=env, check=False)
    lines = [line for line in done.stdout.splitlines() if line.startswith("OUTCOME ")]
    assert lines, f"the child printed no outcome (rc {done.returncode}): {done.stderr[-3000:]}"
    outcome, _, message = lines[-1][len("OUTCOME "):].partition(" ")
    return outcome, message
