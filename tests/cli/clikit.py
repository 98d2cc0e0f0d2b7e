"""Helpers of the ``astream`` command tests: run the command, check its errors, write datasets."""

from __future__ import annotations

import contextlib
import io
import os
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from astream import MDSWriter
from astream.cli import main


@dataclass(frozen=True)
class Result:
    """What one run of the command did (a subprocess or an in-process ``main()``)."""

    returncode: int
    stdout: str
    stderr: str


Run = Callable[..., Result]
COLUMNS = {"id": "int", "text": "str", "vec": "ndarray:float32:4"}
NUM_SAMPLES = 300


def sample(i: int) -> dict[str, object]:
    return {"id": i, "text": f"sample {i}", "vec": np.full(4, i, np.float32)}


def run_cli(*args: str, env: dict[str, str] | None = None, timeout: float = 60) -> Result:
    """``python -m astream.cli ARGS`` in a fresh interpreter, output captured (no TTY: no bars)."""
    done = subprocess.run(
        [sys.executable, "-m", "astream.cli", *args], capture_output=True, text=True, timeout=timeout,
        env={**os.environ, **(env or {})}, check=False,
    )
    return Result(done.returncode, done.stdout, done.stderr)


def run_main(*args: str) -> Result:
    """``astream.cli.main(ARGS)`` in this process: the same code without an interpreter start.

    Each subcommand is also run as a subprocess; the many error cases run here to keep
    the suite fast on a busy machine.
    """
    out, err = io.StringIO(), io.StringIO()
    with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
        try:
            code = main(list(args))
        except SystemExit as exc:  # argparse's usage errors
            code = int(exc.code or 0)
    return Result(code, out.getvalue(), err.getvalue())


def assert_one_line_error(result: Result, code: int, *words: str) -> None:
    """Exit code ``code``, one line on stderr that starts with the command name and holds ``words``."""
    assert result.returncode == code, (result.returncode, result.stdout, result.stderr)
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1, result.stderr
    assert lines[0].startswith("astream"), lines
    assert "Traceback" not in result.stderr
    for word in words:
        assert word in lines[0], (word, lines[0])


def write_dataset(path: Path, n: int = NUM_SAMPLES, **kwargs: object) -> Path:
    """An MDS dataset of ``n`` samples of :data:`COLUMNS` (zstd, sha1 + xxh64, several shards)."""
    options: dict[str, object] = {"compression": "zstd", "hashes": ["sha1", "xxh64"], "size_limit": "4kb"}
    options.update(kwargs)
    with MDSWriter(str(path), COLUMNS, **options) as writer:  # type: ignore[arg-type]
        for i in range(n):
            writer.write(sample(i))
    return path
