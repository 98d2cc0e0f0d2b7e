"""Dependency floors admit no release with a known vulnerability in a parser of untrusted
data (issue 32, finding 7), and the installed versions satisfy the floors."""

from __future__ import annotations

import importlib.metadata
from pathlib import Path

import pytest

tomllib = pytest.importorskip("tomllib", reason="tomllib is in Python 3.11+")
from packaging.requirements import Requirement  # noqa: E402
from packaging.version import Version  # noqa: E402

PYPROJECT = Path(__file__).resolve().parents[2] / "pyproject.toml"

# package -> the first release without the vulnerabilities named
FIXED = {
    "aiohttp": ("3.12.14", "CVE-2024-27306, CVE-2024-52304, CVE-2025-53643"),
    "pillow": ("10.0.1", "CVE-2023-4863"),
    "pyarrow": ("14.0.1", "CVE-2023-47248"),
    "brotli": ("1.2", "CVE-2025-6176; the bounded decoder"),
}


def _requirements() -> list[Requirement]:
    project = tomllib.loads(PYPROJECT.read_text())["project"]
    out = [Requirement(r) for r in project["dependencies"]]
    for extra in project["optional-dependencies"].values():
        out += [Requirement(r) for r in extra if not r.startswith("astream[")]
    return out


@pytest.mark.parametrize("package", sorted(FIXED))
def test_floor_is_past_the_fix(package: str) -> None:
    fixed, cves = FIXED[package]
    found = [r for r in _requirements() if r.name.lower() == package]
    assert found, f"{package} is not a dependency any more: drop it from FIXED"
    for req in found:
        floors = [Version(s.version) for s in req.specifier if s.operator in (">=", "==", "~=")]
        assert floors, f"{req}: no floor"
        assert min(floors) >= Version(fixed), f"{req} admits a release with {cves}: the floor must be >= {fixed}"


@pytest.mark.parametrize("package", sorted(FIXED))
def test_installed_versions_satisfy_the_floors(package: str) -> None:
    try:
        installed = importlib.metadata.version(package)
    except importlib.metadata.PackageNotFoundError:
        pytest.skip(f"{package} is not installed (an optional extra)")
    for req in _requirements():
        if req.name.lower() == package:
            assert req.specifier.contains(installed, prereleases=True), f"installed {package} {installed}: not {req}"
