"""Helpers for the format tests: the recorded MDS datasets and their expected values."""

from __future__ import annotations

import base64
import json
from decimal import Decimal
from pathlib import Path
from typing import Any

import numpy as np

FIXTURES = Path(__file__).resolve().parents[1] / "fixtures" / "mds"


def _manifest() -> dict[str, Any]:
    path = FIXTURES / "manifest.json"
    if not path.is_file():  # collection must not crash; the fixtures_dir fixture reports it
        return {"datasets": []}
    result: dict[str, Any] = json.loads(path.read_text())
    return result


MANIFEST = _manifest()
DATASETS: list[dict[str, Any]] = MANIFEST["datasets"]
WITH_EXPECTED = [d for d in DATASETS if d.get("expected_json")]


class Expected:
    """The recorded values of one fixture dataset."""

    def __init__(self, mds_dir: Path, entry: dict[str, Any]) -> None:
        self.entry = entry
        data = json.loads((mds_dir / entry["expected_json"]).read_text())
        self.columns: dict[str, str] = data["columns"]
        # Big datasets (tiny50k) are stored column-wise: one npz array per column.
        self.columnar = bool(data.get("columnar"))
        self.samples: list[dict[str, Any]] = data.get("samples", [])
        self.num_samples: int = data.get("num_samples", len(self.samples))
        self._npz_keys = data.get("npz_keys")
        npz = entry.get("expected_npz") or (
            entry["expected_json"][: -len(".json")] + ".npz" if self.columnar else None
        )
        self.arrays = dict(np.load(mds_dir / npz)) if npz else {}

    def column(self, name: str) -> Any:
        """The whole expected column of a columnar dataset."""
        keys = self._npz_keys
        key = keys[name] if isinstance(keys, dict) and name in keys else f"col/{name}"
        return self.arrays[key]

    def build_sample(self, i: int) -> dict[str, Any]:
        """Sample ``i`` as a user would write it."""
        if not self.columnar:
            return {name: self.build(tagged) for name, tagged in self.samples[i]["values"].items()}
        sample = {}
        for name, encoding in self.columns.items():
            value = self.column(name)[i]
            sample[name] = int(value) if encoding in ("int", "str_int") else str(value) if encoding == "str" else value
        return sample

    def check(self, actual: Any, tagged: dict[str, Any], where: str) -> None:
        """Assert ``actual`` is exactly the tagged value (bit for bit for numbers)."""
        check_tagged(actual, tagged, self.arrays, where)

    def build(self, tagged: dict[str, Any]) -> Any:
        """The Python value a tag describes (images as PIL images built from their pixels)."""
        return build_tagged(tagged, self.arrays)


def check_tagged(actual: Any, tagged: dict[str, Any], arrays: dict[str, Any], where: str) -> None:
    t = tagged["t"]
    if t.startswith("np."):
        assert type(actual) is getattr(np, t[3:]), f"{where}: {type(actual)} is not {t}"
        assert actual.tobytes().hex() == tagged["hex"], f"{where}: {actual!r} != {tagged}"
    elif t == "int":
        ok = type(actual) is int and actual == tagged["v"]
        assert ok, f"{where}: {actual!r} != {tagged['v']}"
    elif t == "float":
        ok = type(actual) is float and repr(actual) == tagged["repr"]
        assert ok, f"{where}: {actual!r} != {tagged['repr']}"
    elif t == "decimal":
        ok = isinstance(actual, Decimal) and str(actual) == tagged["v"]
        assert ok, f"{where}: {actual!r}"
    elif t == "str":
        ok = type(actual) is str and actual == tagged["v"]
        assert ok, f"{where}: {actual!r} != {tagged['v']!r}"
    elif t == "bytes":
        ok = type(actual) is bytes and actual == base64.b64decode(tagged["b64"])
        assert ok, f"{where}: {actual!r}"
    elif t == "bool":
        assert actual is tagged["v"], f"{where}: {actual!r}"
    elif t == "none":
        assert actual is None, f"{where}: {actual!r}"
    elif t == "complex":
        assert type(actual) is complex, f"{where}: {actual!r}"
        assert (repr(actual.real), repr(actual.imag)) == (tagged["re"], tagged["im"]), f"{where}: {actual!r}"
    elif t in ("list", "tuple"):
        assert type(actual) is (list if t == "list" else tuple), f"{where}: {type(actual)} is not {t}"
        assert len(actual) == len(tagged["v"]), f"{where}: length {len(actual)} != {len(tagged['v'])}"
        for k, (a, e) in enumerate(zip(actual, tagged["v"], strict=True)):
            check_tagged(a, e, arrays, f"{where}[{k}]")
    elif t in ("set", "frozenset"):
        assert type(actual) is (set if t == "set" else frozenset), f"{where}: {type(actual)}"
        items = sorted(actual, key=repr)
        assert len(items) == len(tagged["v"]), f"{where}: {actual!r}"
        for k, (a, e) in enumerate(zip(items, tagged["v"], strict=True)):
            check_tagged(a, e, arrays, f"{where}{{{k}}}")
    elif t == "dict":
        ok = type(actual) is dict and len(actual) == len(tagged["items"])
        assert ok, f"{where}: {actual!r}"
        for (ak, av), (ek, ev) in zip(actual.items(), tagged["items"], strict=True):
            check_tagged(ak, ek, arrays, f"{where} key")
            check_tagged(av, ev, arrays, f"{where}[{ak!r}]")
    elif t == "ndarray":
        expected = arrays[tagged["npz"]]
        assert isinstance(actual, np.ndarray), f"{where}: {type(actual)}"
        ok = actual.dtype.name == tagged["dtype"] and list(actual.shape) == tagged["shape"]
        assert ok, f"{where}"
        ok = actual.dtype == expected.dtype and actual.tobytes() == expected.tobytes()
        assert ok, f"{where}: values differ"
    elif t == "image":
        from PIL import Image

        assert isinstance(actual, Image.Image), f"{where}: {type(actual)}"
        assert (actual.mode, list(actual.size), actual.format) == (tagged["mode"], tagged["size"], tagged["format"]), where
        pixels = np.asarray(actual)
        expected = arrays[tagged["npz"]]
        ok = pixels.dtype == expected.dtype and np.array_equal(pixels, expected)
        assert ok, f"{where}: pixels differ"
    else:
        raise AssertionError(f"{where}: unknown tag {t!r}")


def build_tagged(tagged: dict[str, Any], arrays: dict[str, Any]) -> Any:
    t = tagged["t"]
    if t.startswith("np."):
        return np.frombuffer(bytes.fromhex(tagged["hex"]), np.dtype(t[3:]).newbyteorder("<"))[0]
    simple = {
        "int": lambda: tagged["v"], "str": lambda: tagged["v"], "bool": lambda: tagged["v"],
        "float": lambda: float(tagged["repr"]), "decimal": lambda: Decimal(tagged["v"]),
        "bytes": lambda: base64.b64decode(tagged["b64"]), "none": lambda: None,
        "complex": lambda: complex(float(tagged["re"]), float(tagged["im"])),
        "ndarray": lambda: arrays[tagged["npz"]],
    }
    if t in simple:
        return simple[t]()
    if t in ("list", "tuple", "set", "frozenset"):
        kind = {"list": list, "tuple": tuple, "set": set, "frozenset": frozenset}[t]
        return kind(build_tagged(v, arrays) for v in tagged["v"])
    if t == "dict":
        return {build_tagged(k, arrays): build_tagged(v, arrays) for k, v in tagged["items"]}
    if t == "image":
        from PIL import Image

        pixels = arrays[tagged["npz"]]
        if tagged["mode"] == "1":
            return Image.fromarray(pixels).convert("1")
        image = Image.fromarray(pixels, mode=None)
        if image.mode != tagged["mode"]:
            image = Image.frombytes(tagged["mode"], tuple(tagged["size"]), pixels.tobytes())
        return image
    raise AssertionError(f"unknown tag {t!r}")


def dataset_root(mds_dir: Path, entry: dict[str, Any]) -> tuple[Path, str | None]:
    return mds_dir / entry["path"], entry["split"]
