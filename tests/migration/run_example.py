"""Run one of ``examples/`` under mosaicml-streaming or, with its imports changed, under astream.

``python run_example.py peer|astream EXAMPLE WORKDIR RESULT``. For ``astream`` the example's
import lines are rewritten (``streaming`` -> ``astream``, nothing else), the copy is saved
in WORKDIR and run; for ``peer`` the example runs as written, with the empty
``streaming.vision`` module the peer's package needs without torchvision. Either way it
runs as ``__main__``, as a user would run it.
"""

from __future__ import annotations

import re
import runpy
import sys
import types
from pathlib import Path

# Each MosaicML import line an example may hold, and the line a user writes for astream.
IMPORTS = (
    (re.compile(r"^from streaming import (.+)$"), r"from astream import \1"),
    (re.compile(r"^from streaming\.base\.util import merge_index$"), "from astream import merge_index"),
    (re.compile(r"^import streaming$"), "import astream as streaming"),
)


def to_astream(source: str) -> str:
    """The example with only its imports changed; any other mention of the peer is refused."""
    lines = []
    for line in source.splitlines():
        for pattern, replacement in IMPORTS:
            if pattern.match(line):
                line = pattern.sub(replacement, line)
                break
        else:
            if re.match(r"^\s*(from|import)\s+streaming\b", line):
                raise SystemExit(f"an import of the peer this runner cannot translate: {line!r}")
        lines.append(line)
    return "\n".join(lines) + "\n"


def main() -> None:
    flavour, example, workdir, result = sys.argv[1], Path(sys.argv[2]), Path(sys.argv[3]), sys.argv[4]
    workdir.mkdir(parents=True, exist_ok=True)
    if flavour == "peer":
        vision = types.ModuleType("streaming.vision")
        vision.__path__ = []  # type: ignore[attr-defined]
        sys.modules.setdefault("streaming.vision", vision)
        path = example
    else:
        path = workdir / example.name
        path.write_text(to_astream(example.read_text()))
    sys.argv = [str(path), str(workdir / "data"), result]
    runpy.run_path(str(path), run_name="__main__")


if __name__ == "__main__":
    main()
