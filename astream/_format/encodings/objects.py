"""Object encodings: ``json`` and ``pkl``.

``json`` is ``json.dumps(value)`` in UTF-8 (a numpy array is turned into a list
first, as MosaicML Streaming does). ``pkl`` is ``pickle.dumps(value)`` with the default
protocol; decoding a pickle can run arbitrary code, so it is marked unsafe and readers
refuse it unless the user passes ``allow_unsafe_types=True``.
"""

from __future__ import annotations

import json
import pickle
from typing import Any

import numpy as np

from astream._format.encodings.base import Buffer, Encoding

__all__ = ["JSONEncoding", "PickleEncoding"]


class JSONEncoding(Encoding):
    """``json``: any JSON-serialisable value."""

    name = "json"

    def encode(self, value: Any) -> bytes:
        if isinstance(value, np.ndarray):
            value = value.tolist()
        try:
            text = json.dumps(value)
        except (TypeError, ValueError, RecursionError) as exc:
            raise self.reject(value, f"takes JSON-serialisable values ({exc})") from exc
        try:
            return text.encode("utf-8")
        except UnicodeEncodeError as exc:  # a lone surrogate in a dict key survives dumps()
            raise self.reject(value, f"cannot store this value as UTF-8 ({exc.reason})") from exc

    def decode_unchecked(self, data: Buffer) -> Any:
        return json.loads(str(data, "utf-8"))


class PickleEncoding(Encoding):
    """``pkl``: any picklable object. Unsafe to decode from untrusted data."""

    name = "pkl"
    safe = False

    def encode(self, value: Any) -> bytes:
        try:
            return pickle.dumps(value)
        except Exception as exc:  # pickling can fail in any __reduce__ a user wrote
            raise self.reject(value, f"takes picklable values ({type(exc).__name__}: {exc})") from exc

    def decode_unchecked(self, data: Buffer) -> Any:
        return pickle.loads(data)
