"""The adapters' contract with the rest of astream: public API only, lazy framework imports."""

from __future__ import annotations

import ast
import importlib
import json
import subprocess
import sys
from pathlib import Path

import pytest

import astream
from astream.errors import MissingExtraError

ADAPTERS = Path(astream.__file__).resolve().parent / "adapters"
PUBLIC = {"astream", "astream.errors", "astream.sampling"}
FRAMEWORKS = {"keras": "keras", "tf": "tensorflow", "jax": "jax", "torch": "torch"}


@pytest.mark.parametrize("path", sorted(ADAPTERS.glob("*.py")), ids=lambda p: p.name)
def test_adapters_use_only_the_public_api(path: Path) -> None:
    tree = ast.parse(path.read_text(), str(path))
    for node in ast.walk(tree):
        names = [a.name for a in node.names] if isinstance(node, ast.Import) else []
        if isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        for name in names:
            if name.startswith("astream"):
                assert name in PUBLIC or name.startswith("astream.adapters"), f"{path.name} imports {name}"


@pytest.mark.parametrize(("adapter", "framework"), sorted(FRAMEWORKS.items()))
def test_missing_framework_names_the_extra(adapter: str, framework: str, monkeypatch: pytest.MonkeyPatch) -> None:
    # sys.modules[name] = None is how Python spells "this module cannot be imported".
    monkeypatch.setitem(sys.modules, framework, None)
    monkeypatch.delitem(sys.modules, f"astream.adapters.{adapter}", raising=False)
    with pytest.raises(MissingExtraError, match=rf"astream\[{adapter}\]") as info:
        importlib.import_module(f"astream.adapters.{adapter}")
    assert info.value.extra == adapter
    assert isinstance(info.value, ImportError)


_PROBE = """
import json, sys
import astream.adapters.keras, astream.adapters.tf, astream.adapters.jax
print(json.dumps(sorted(m for m in ("keras", "tensorflow", "jax", "torch") if m in sys.modules)))
"""


def test_importing_an_adapter_imports_no_framework() -> None:
    for module in ("keras", "tensorflow", "jax"):
        if importlib.util.find_spec(module) is None:
            pytest.skip(f"{module} is not installed")
    out = subprocess.run([sys.executable, "-c", _PROBE], capture_output=True, text=True, check=True).stdout
    assert json.loads(out) == []
