"""Layers import downward only (DESIGN.md), and the pure layers do no I/O."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PACKAGE = Path(__file__).resolve().parent.parent / "astream"

# A module of a layer may import astream modules of its own layer and the layers before it.
LAYERS = [
    ("errors", "_units", "_arrays", "_checks", "_resource"),
    ("_format",),
    ("_storage",),
    ("_cache",),
    ("_coord",),
    ("_node",),
    ("_sampling", "sampling"),
    ("_dataset", "testing", "_loopback", "metrics"),
    ("adapters",),
    ("convert",),
    ("cli",),
]
PURE = {"_format", "_sampling", "sampling"}
IO_MODULES = {"asyncio", "aiohttp", "aiofiles", "socket", "uvloop", "aiobotocore", "selectors"}


def _layer_of(part: str) -> int:
    for i, names in enumerate(LAYERS):
        if part in names:
            return i
    raise AssertionError(f"astream.{part} is in no layer of tests/test_layers.py; add it")


def _modules() -> list[Path]:
    return sorted(p for p in PACKAGE.rglob("*.py"))


def _top_part(path: Path) -> str:
    rel = path.relative_to(PACKAGE).with_suffix("")
    return rel.parts[0]


@pytest.mark.parametrize("path", _modules(), ids=lambda p: str(p.relative_to(PACKAGE)))
def test_imports_point_down(path: Path) -> None:
    part = _top_part(path)
    if part == "__init__":
        return  # the front door re-exports from every layer
    own = _layer_of(part)
    tree = ast.parse(path.read_text(), str(path))
    for node in ast.walk(tree):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            names = [node.module]
        for name in names:
            root = name.split(".")[0]
            if part in PURE:
                assert root not in IO_MODULES, f"{path}: the pure layer astream.{part} imports {name}"
            if root != "astream" or name == "astream":
                continue
            target = name.split(".")[1]
            assert _layer_of(target) <= own, f"{path}: astream.{part} imports {name}, a layer below it"
