"""The peers' interpreters: found, or created on request with the pinned versions.

Each peer lives in a virtual environment of its own (none is a dependency of astream, and
mosaicml-streaming and LitData need torch). An interpreter is taken, in order, from
``--peer-python NAME=PATH``, the peer's environment variable, ``<peers>/<name>/bin/python``
(the folder :func:`create` fills; ``$ASTREAM_BENCH_PEERS``, else
``~/.cache/astream-bench/peers``), or the running interpreter when it imports the package.
docs/bench/peer.md tells the same steps by hand, and why each quirk is there.
"""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import venv
from dataclasses import dataclass
from pathlib import Path

from astream.cli._output import CommandError

__all__ = ["PEERS", "Peer", "create", "find", "peers_folder"]

_COMPLETE = ".astream-bench-complete"  # written last: a half-made environment is not found
TORCH = "torch==2.13.0"  # the CPU wheel; installed first, then held by a constraint


@dataclass(frozen=True)
class Peer:
    """A library astream is measured against, and how its environment is made."""

    name: str
    module: str  # what it imports as
    env_var: str
    installs: tuple[tuple[str, ...], ...]  # pip argument lists, in order
    after: tuple[str, ...] = ()  # pip uninstall, once installed


# Pinned to the versions docs/bench/ measured. torchvision comes with torch's dependents and
# fails to import beside the CPU torch; nothing the benchmarks use needs it.
PEERS = {
    "mosaicml": Peer("mosaicml", "streaming", "ASTREAM_PEER_PYTHON",
                     ((TORCH,), ("-c", "{constraints}", "mosaicml-streaming==0.13.0")), ("torchvision",)),
    "litdata": Peer("litdata", "litdata", "ASTREAM_LITDATA_PYTHON",
                    ((TORCH,), ("-c", "{constraints}", "litdata==0.2.76", "pyarrow", "polars")), ("torchvision",)),
    "hf": Peer("hf", "datasets", "ASTREAM_HF_PYTHON", (("datasets==5.2.0", "aiohttp", "requests"),)),
    "webdataset": Peer("webdataset", "webdataset", "ASTREAM_WDS_PYTHON", (("webdataset==1.0.2", "numpy"),)),
}


def peers_folder() -> Path:
    """Where :func:`create` makes the peers' environments."""
    default = Path(os.environ.get("XDG_CACHE_HOME", Path.home() / ".cache")) / "astream-bench" / "peers"
    return Path(os.environ.get("ASTREAM_BENCH_PEERS", default))


def _check(name: str) -> Peer:
    if name not in PEERS:
        raise CommandError(f"no peer {name!r}; the peers are {', '.join(PEERS)}", 2)
    return PEERS[name]


def find(name: str, given: dict[str, str]) -> str | None:
    """The interpreter of peer ``name``, or None where it is not installed."""
    peer = _check(name)
    explicit = given.get(name) or os.environ.get(peer.env_var)
    if explicit:
        if not os.access(explicit, os.X_OK):
            raise CommandError(f"the {name} interpreter {explicit} does not exist or cannot run", 2)
        return explicit
    made = peers_folder() / name
    if (made / _COMPLETE).exists():
        return str(made / "bin" / "python")
    return sys.executable if importlib.util.find_spec(peer.module) is not None else None


def create(name: str, quiet: bool = False) -> str:
    """Make peer ``name``'s environment under :func:`peers_folder` (unless it is there) and
    return its interpreter. Needs the package index; takes minutes for the torch peers."""
    peer = _check(name)
    home = peers_folder() / name
    python = home / "bin" / "python"
    if (home / _COMPLETE).exists():
        return str(python)
    venv.EnvBuilder(with_pip=True, clear=True).create(home)  # (a half-made one from before is cleared)
    constraints = home / "constraints.txt"
    constraints.write_text(TORCH + "\n")
    pip = [str(python), "-m", "pip"]
    out = subprocess.DEVNULL if quiet else None
    for args in peer.installs:
        print(f"{name}: pip install {' '.join(args)}", file=sys.stderr, flush=True)
        subprocess.run([*pip, "install", "--quiet", *(a.replace("{constraints}", str(constraints)) for a in args)],
                       check=True, stdout=out)
    if peer.after:
        subprocess.run([*pip, "uninstall", "--quiet", "-y", *peer.after], check=True, stdout=out)
    (home / _COMPLETE).touch()
    return str(python)
