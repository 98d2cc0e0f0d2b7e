"""The repository is self-contained: nothing in it reads or points to a path outside it.

A fresh clone must build, run and test with nothing beside it, so no test, benchmark
default, doc or comment may name the development team's ``shared/`` folder or a path of a
particular machine (a venv or a data folder). The fixtures the suite reads live in
``tests/fixtures`` (README there); the reference notes live in ``docs/``.
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parent.parent

# Each pattern with why it is out of bounds. The words are assembled, so that this file
# itself names no such path (a search of the tree for them finds only real references).
SHARED, WORK, PEER = "shared", "work", "PEER"
FORBIDDEN = {
    r"\.\./" + SHARED + r"\b": "the team's shared/ folder beside a checkout",
    r"\b" + SHARED + r"/(fixtures|spec|hooks)\b": "the team's shared/ folder beside a checkout",
    r"\b" + PEER + r"\.md\b": "the team's notes on the peer; the repository has docs/bench/peer.md",
    r"(?<![\w.<>$-])/" + WORK + "/": "a folder of one development machine",
    r"(?<![\w.<>$-])/(root|home/[a-z]+)/\.?(venv|peer|bench)": "a venv or data folder of one machine",
    r"\bdevvenv\b": "a venv of one development machine",
}
TEXT_SUFFIXES = {".py", ".md", ".toml", ".yml", ".yaml", ".cfg", ".ini", ".txt", ".sh", ""}


def _tracked_and_new_files() -> list[Path]:
    """Files git would put in a commit (tracked, plus untracked ones that are not ignored)."""
    out = subprocess.run(
        ["git", "ls-files", "--cached", "--others", "--exclude-standard"],
        cwd=REPO, capture_output=True, text=True, check=False,
    )
    if out.returncode != 0:  # an exported tree without .git: walk it instead
        return [p for p in REPO.rglob("*") if p.is_file() and ".venv" not in p.parts and ".git" not in p.parts]
    return [REPO / line for line in out.stdout.splitlines() if line]


def _scanned() -> list[Path]:
    files = []
    for path in _tracked_and_new_files():
        rel = path.relative_to(REPO)
        if rel.parts[:2] == ("tests", "fixtures") and path.suffix != ".py" and path.name != "README.md":
            continue  # recorded data, not prose or code
        if path == Path(__file__).resolve() or not path.is_file():  # its patterns and samples
            continue
        if path.suffix in TEXT_SUFFIXES or path.name in {"Makefile", "run"}:
            files.append(path)
    return files


def test_the_scan_sees_the_tree() -> None:
    names = {p.relative_to(REPO).as_posix() for p in _scanned()}
    # A scan that silently saw nothing would pass on any tree.
    assert {"Makefile", ".ci/run", "README.md", "astream/__init__.py", "tests/conftest.py"} <= names


@pytest.mark.parametrize(("pattern", "why"), FORBIDDEN.items())
def test_nothing_points_outside_the_repository(pattern: str, why: str) -> None:
    regex = re.compile(pattern)
    hits = []
    for path in _scanned():
        for number, line in enumerate(path.read_text(errors="replace").splitlines(), 1):
            if regex.search(line):
                hits.append(f"{path.relative_to(REPO)}:{number}: {line.strip()}")
    assert not hits, f"references to {why} (keep the repository self-contained):\n" + "\n".join(hits)


def test_the_patterns_catch_what_they_are_for() -> None:
    keys = list(FORBIDDEN)
    samples = {
        keys[0]: f'FIXTURES = REPO.parent / "../{SHARED}"',
        keys[1]: f"see {SHARED}/spec/sample-order.md",
        keys[2]: f"see {PEER}.md",
        keys[3]: f'PEER_PYTHON = "/{WORK}/peer-venv/bin/python"',
        keys[4]: "/home/alice/" + "venv/bin/python",  # (in two parts: this file names no such path)
        keys[5]: "devvenv/bin/python bench.py",
    }
    assert samples.keys() == FORBIDDEN.keys()
    for pattern, line in samples.items():
        assert re.search(pattern, line), pattern
    # Paths inside the repository or the temp dir stay allowed.
    for line in ("<data>/root/bucket/ds", "tests/fixtures/orders", "$ASTREAM_BENCH_DATA/loader"):
        assert not any(re.search(p, line) for p in FORBIDDEN), line
