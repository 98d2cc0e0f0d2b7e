"""The code a side of a paired A/B runs: a checkout folder, or a commit extracted from git.

Only the ``astream`` package of the other side is used: the benchmark, its workloads and
its datasets come from the driver's checkout, so a commit whose ``benchmarks/`` has another
layout (or none) is measured by today's benchmarks.
"""

from __future__ import annotations

import io
import os
import subprocess
import tarfile
from pathlib import Path

from astream.cli._output import CommandError

__all__ = ["THIS", "resolve"]

THIS = str(Path(__file__).resolve().parents[3])  # the checkout holding this astream package


def _git(*args: str) -> str:
    try:
        done = subprocess.run(["git", "-C", THIS, *args], capture_output=True, text=True, check=False)
    except OSError as exc:
        raise CommandError(f"git {' '.join(args)}: {exc} (a commit needs git; give a checkout folder instead)", 2) from exc
    if done.returncode:
        raise CommandError(f"git {' '.join(args)}: {done.stderr.strip() or 'failed'}", 2)
    return done.stdout.strip()


def resolve(ref: str, cache: Path) -> str:
    """The folder holding the ``astream`` package of ``ref``: a checkout (or any folder with
    an ``astream/`` inside), or a commit-ish of this repository, whose ``astream/`` is
    extracted once into ``cache/checkouts/<sha>``.

    Raises:
        CommandError: ``ref`` is neither (exit code 2).
    """
    path = Path(ref).expanduser()
    if path.is_dir():
        if not (path / "astream" / "__init__.py").is_file():
            raise CommandError(f"--base/--head {ref}: no astream/__init__.py in that folder; give a checkout "
                               "of astream or a commit", 2)
        return str(path.resolve())
    sha = _git("rev-parse", "--verify", "--quiet", f"{ref}^{{commit}}")
    target = cache / "checkouts" / sha
    if not (target / "astream" / "__init__.py").is_file():
        archive = subprocess.run(["git", "-C", THIS, "archive", sha, "astream"], capture_output=True, check=True)
        partial = target.with_name(f"{sha}.partial-{os.getpid()}")
        with tarfile.open(fileobj=io.BytesIO(archive.stdout)) as tar:
            tar.extractall(partial, filter="data") if hasattr(tarfile, "data_filter") else tar.extractall(partial)
        partial.replace(target)
    return str(target)
