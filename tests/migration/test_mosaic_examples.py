"""MosaicML Streaming's documented examples run under astream with only their imports changed.

Each program in ``examples/`` is written as MosaicML's docs write it; its output under
mosaicml-streaming 0.13.0 is recorded in ``tests/fixtures/examples/`` (see
``tests/fixtures/record_examples.py``). Here the same program, imports rewritten by
``run_example.py``, runs under astream in a process of its own and must print the same.
"""

from __future__ import annotations

import difflib
import hashlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from run_example import to_astream

HERE = Path(__file__).resolve().parent
REPO = HERE.parent.parent
EXAMPLES = sorted(p.stem for p in (HERE / "examples").glob("*.py"))


def _recorded(fixtures_dir: Path, name: str) -> dict:
    return json.loads((fixtures_dir / "examples" / f"{name}.json").read_text())


@pytest.mark.parametrize("name", EXAMPLES)
def test_example_matches_mosaicml(fixtures_dir: Path, tmp_path: Path, name: str) -> None:
    example = HERE / "examples" / f"{name}.py"
    recorded = _recorded(fixtures_dir, name)
    assert recorded["example_sha1"] == hashlib.sha1(example.read_bytes()).hexdigest(), (
        f"{example.name} changed since its peer output was recorded; re-record with "
        "tests/fixtures/record_examples.py --write")
    result = tmp_path / "result.json"
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO), os.environ.get("PYTHONPATH", "")])}
    proc = subprocess.run([sys.executable, str(HERE / "run_example.py"), "astream", str(example), str(tmp_path / "run"),
                           str(result)], capture_output=True, text=True, timeout=120, env=env, check=False)
    assert proc.returncode == 0, proc.stderr[-4000:]
    got = json.loads(result.read_text())
    for key, theirs in recorded["result"].items():
        assert got[key] == theirs, f"{name}: {key!r} differs from mosaicml-streaming's output"
    assert got.keys() == recorded["result"].keys()


@pytest.mark.parametrize("name", EXAMPLES)
def test_only_the_imports_change(name: str) -> None:
    source = (HERE / "examples" / f"{name}.py").read_text()
    changed = [line for line in difflib.ndiff(source.splitlines(), to_astream(source).splitlines())
               if line.startswith(("- ", "+ "))]
    assert changed, f"{name} imports nothing from streaming"
    assert all("import" in line and ("streaming" in line or "astream" in line) for line in changed), changed


def test_an_untranslatable_import_is_refused() -> None:
    with pytest.raises(SystemExit, match="cannot translate"):
        to_astream("from streaming.base.shuffle import get_shuffle\n")
