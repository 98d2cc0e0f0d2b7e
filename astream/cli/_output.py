"""Output helpers shared by the subcommands: sizes, tables, progress bars, failures.

Results go to stdout, progress bars and errors to stderr, so ``astream inspect ds
--json | jq`` stays clean. Progress bars appear only on a terminal: piped output and
``--quiet`` get none.
"""

from __future__ import annotations

import sys
from collections.abc import Sequence
from typing import Any

from tqdm import tqdm

__all__ = ["CommandError", "format_size", "print_table", "progress", "show_progress"]


class CommandError(Exception):
    """A failure the command reports as one line, with its exit code.

    Attributes:
        code: 2 for bad arguments, 1 for everything else.
    """

    def __init__(self, message: str, code: int = 1) -> None:
        super().__init__(message)
        self.code = code

    def __reduce__(self) -> tuple[type[CommandError], tuple[str, int]]:
        # Raised in `convert`'s worker processes too: keep the code across pickling.
        return (CommandError, (str(self), self.code))


def format_size(n: float) -> str:
    """``1536`` -> ``"1.5 KiB"``: bytes in powers of 1024, as MDS size limits are."""
    for unit in ("B", "KiB", "MiB", "GiB", "TiB"):
        if abs(n) < 1024 or unit == "TiB":
            return f"{int(n)} B" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    raise AssertionError("unreachable")


def print_table(headers: Sequence[str], rows: Sequence[Sequence[Any]], right: Sequence[int] = ()) -> None:
    """Print ``rows`` under ``headers`` in aligned columns (``right``: right-aligned column numbers)."""
    cells = [[str(c) for c in headers], *([str(c) for c in row] for row in rows)]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    for row in cells:
        line = "  ".join(c.rjust(w) if i in right else c.ljust(w) for i, (c, w) in enumerate(zip(row, widths, strict=True)))
        print("  " + line.rstrip())


def show_progress(quiet: bool) -> bool:
    """Whether to draw progress bars: on a terminal, unless ``--quiet``."""
    return not quiet and sys.stderr.isatty() and sys.stdout.isatty()


def progress(quiet: bool, **kwargs: Any) -> tqdm[Any]:
    """A tqdm bar on stderr, disabled when :func:`show_progress` says so."""
    return tqdm(disable=not show_progress(quiet), file=sys.stderr, dynamic_ncols=True, **kwargs)
