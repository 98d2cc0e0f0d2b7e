"""The front door: ``astream.__all__`` lists exactly the public names it exports."""

from __future__ import annotations

import inspect
import json
import subprocess
import sys

import astream

# Run in a fresh interpreter: importing astream.cli or astream.testing anywhere in the test
# session adds those submodules as attributes of the package, which `import astream` alone
# does not export.
_PROBE = """
import json, types, astream
names = {"__version__"}
for name in dir(astream):  # (the names imported on first use too)
    value = getattr(astream, name)
    if name.startswith("_"):
        continue
    if isinstance(value, types.ModuleType):
        if value.__name__.startswith("astream."):
            names.add(name)
    elif getattr(value, "__module__", "").startswith("astream"):
        names.add(name)
print(json.dumps({"exported": sorted(names), "all": list(astream.__all__)}))
"""


def test_all_is_what_is_exported() -> None:
    result = json.loads(subprocess.run([sys.executable, "-c", _PROBE], check=True, capture_output=True, text=True).stdout)
    assert sorted(result["all"]) == result["exported"]
    assert len(result["all"]) == len(set(result["all"]))


def test_public_classes_present_themselves_as_astream() -> None:
    for name in astream.__all__:
        value = getattr(astream, name)
        if isinstance(value, type) and not issubclass(value, BaseException):
            assert value.__module__ == "astream", name


def test_the_writers_of_every_format_are_public() -> None:
    # MosaicML's writer names, so `from streaming import CSVWriter` becomes `from astream import CSVWriter`.
    for name in ("MDSWriter", "JSONWriter", "CSVWriter", "TSVWriter", "XSVWriter"):
        assert name in astream.__all__
        writer = getattr(astream, name)
        assert writer.format == name.removesuffix("Writer").lower()
        params = inspect.signature(writer).parameters
        assert list(params)[:6] == ["out", "columns", "compression", "hashes", "size_limit", "exist_ok"]
        assert {"keep_local", "progress_bar", "max_workers"} <= set(params)


def test_the_writers_and_converters_are_imported_on_first_use() -> None:
    # A program that only reads (a job starting cold) does not pay for them: ~10 ms a process.
    probe = (
        "import json, sys, astream\n"
        "heavy = ('tqdm', 'astream.convert', 'astream._storage.upload', 'astream._format.writer')\n"
        "before = [m for m in heavy if m in sys.modules]\n"
        "writer = astream.MDSWriter\n"
        "print(json.dumps([before, [m for m in heavy if m in sys.modules], writer.__module__, 'MDSWriter' in dir(astream)]))\n"
    )
    out = subprocess.run([sys.executable, "-c", probe], check=True, capture_output=True, text=True).stdout
    before, after, module, listed = json.loads(out)
    assert before == []
    assert set(after) >= {"astream._storage.upload", "astream._format.writer", "tqdm"}
    assert module == "astream"
    assert listed
