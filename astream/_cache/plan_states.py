"""Where an epoch's shuffle draws begin, node by node, kept in the node's cache for the
node's other processes.

A rank's (or a loader worker's) plan computes only its own canonical nodes' part of the
shuffle, but must make the draws of every canonical node before them
(:mod:`astream._sampling.shuffle.nodes`): at 10^9 samples that is ~15 s of one core for
the last node's ranks, in each of a node's up to 72 processes. The generator's state where
each node's draws begin is ~150 bytes; the first process to find them writes them here
(``<cache>/.astream-plan/<shuffle key>.json``, the key a digest of every input of that
shuffle), and a later process (the node's other ranks and workers, the next run) starts at
its own canonical node.

The file is written atomically and checksummed; one that does not read back exactly
(corrupt, another key, states of another generator) is ignored, never half-used: a wrong
state would be a wrong order, so only a file that proves itself is taken.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Mapping
from typing import Any

import xxhash

__all__ = ["PLAN_FOLDER", "load_plan_states", "save_plan_states"]

PLAN_FOLDER = ".astream-plan"  # under a cache folder: one file per shuffle key


def _path(folder: str, key: str) -> str:
    return os.path.join(folder, PLAN_FOLDER, f"{key}.json")


def _sound(state: Any) -> bool:
    inner = state.get("state") if isinstance(state, dict) else None
    return (isinstance(inner, dict) and state.get("bit_generator") == "PCG64"
            and all(isinstance(inner.get(k), int) for k in ("state", "inc"))
            and isinstance(state.get("has_uint32"), int) and isinstance(state.get("uinteger"), int))


def load_plan_states(folder: str, key: str) -> dict[int, dict[str, Any]]:
    """The states kept under ``key`` in ``folder`` (empty where there are none, or the
    file does not prove itself)."""
    try:
        with open(_path(folder, key), "rb") as fh:
            data = fh.read(1 << 24)
        obj = json.loads(data)
        body = json.dumps(obj["states"], sort_keys=True).encode()
        if obj.get("key") != key or obj.get("xxh3") != xxhash.xxh3_64_hexdigest(body + key.encode()):
            return {}
        states = {int(node): state for node, state in obj["states"].items()}
    except (OSError, ValueError, KeyError, TypeError, AttributeError):
        return {}
    return states if all(_sound(s) for s in states.values()) else {}


def save_plan_states(folder: str, key: str, states: Mapping[int, Mapping[str, Any]]) -> None:
    """Add ``states`` to those kept under ``key`` (atomically; a failure to write only
    loses the shortcut)."""
    merged = {**load_plan_states(folder, key), **{int(k): dict(v) for k, v in states.items()}}
    if not merged:
        return
    body = {str(k): merged[k] for k in sorted(merged)}
    text = json.dumps(body, sort_keys=True).encode()
    record = {"key": key, "xxh3": xxhash.xxh3_64_hexdigest(text + key.encode()), "states": body}
    target = _path(folder, key)
    with contextlib.suppress(OSError):
        os.makedirs(os.path.dirname(target), exist_ok=True)
        fd, tmp = tempfile.mkstemp(dir=os.path.dirname(target), suffix=".tmp")
        try:
            with os.fdopen(fd, "w") as out:
                json.dump(record, out)
            os.replace(tmp, target)
        finally:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
