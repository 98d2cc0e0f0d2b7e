"""Where a benchmark's child process runs one code or the other (this checkout, or ``--base``)."""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

__all__ = ["code_env"]


def code_env(env: dict[str, str], code: str, base: str | None) -> dict[str, Any]:
    """Where a child running ``code`` starts: its package first on ``PYTHONPATH``, and in its
    directory (``env`` and ``cwd`` for :func:`subprocess.run`).

    Not only for the child itself (which also puts ``--base`` first on its own path): the
    forkserver that starts the workers imports astream with a path of its own (Python 3.11's
    ignores the parent's ``sys.path``), which begins with the working directory and then
    ``PYTHONPATH``: run from this checkout, a base child's workers ran this checkout's code.
    """
    first = base if code == "base" and base else str(Path(__file__).resolve().parent.parent)
    rest = env.get("PYTHONPATH", "")
    return {"env": {**env, "PYTHONPATH": first + (os.pathsep + rest if rest else "")}, "cwd": first}
