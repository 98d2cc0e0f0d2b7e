"""``astream cache status PATH``: what a cache folder holds, read from the disk alone.

Read-only (safe beside running jobs: nothing is created, locked or removed): the remote
the folder was claimed for (``.astream-origin.json``), its index, the shards present
(complete, of the wrong size, compressed copies), the temporaries of transfers (their
writer alive or gone), the durability markers of runs (``.astream-unsynced.*``), the
plan states, and the node agents listening on this machine.

Which agent serves the folder cannot be told today: an agent's address hashes the
folder with the job's run id and the dataset's identity, and nothing on disk records
it. The node-wide cache of issue 35 keys the agent by the folder and the user, which
makes it derivable from PATH alone.
"""

from __future__ import annotations

import argparse
import json
import os
from typing import Any

from astream._cache.durability import find_markers, pid_alive
from astream._cache.install import find_temporaries
from astream._cache.origin import ORIGIN_NAME, read_origin
from astream._cache.plan_states import PLAN_FOLDER
from astream._coord.rendezvous import listening_agents
from astream._format.index import INDEX_NAME, Index
from astream.cli._output import CommandError, format_size

__all__ = ["add_parser", "status"]


def add_parser(sub: Any, common: argparse.ArgumentParser) -> None:
    """Declare ``astream cache`` and its actions."""
    p = sub.add_parser("cache", parents=[common], help="look at a local cache folder",
                       description="Look at a cache folder (the `local` of a stream).")
    actions = p.add_subparsers(dest="action", required=True, metavar="ACTION")
    s = actions.add_parser("status", parents=[common], help="shards, bytes, temporaries and agents of a cache folder",
                           description="Show what a cache folder holds, without changing anything in it.")
    s.add_argument("path", metavar="PATH", help="the cache folder (a stream's local)")
    s.add_argument("--split", help="sub-folder of PATH holding the split's index.json")
    s.add_argument("--json", action="store_true", help="print the status as JSON")
    s.set_defaults(func=run_status)


def _on_disk(root: str, index: Index) -> dict[str, Any]:
    complete = wrong = zipped = 0
    raw_bytes = zip_bytes = 0
    missing: list[int] = []
    for shard in index.shards:
        try:
            size = os.stat(os.path.join(root, shard.raw_data.basename)).st_size
        except FileNotFoundError:
            size = None
        if size == shard.raw_data.bytes:
            complete += 1
            raw_bytes += size
        elif size is not None:
            wrong += 1  # a later run checks (and replaces) it
            raw_bytes += size
        if shard.zip_data is not None:
            try:
                zip_bytes += os.stat(os.path.join(root, shard.zip_data.basename)).st_size
                zipped += 1
            except FileNotFoundError:
                pass
        if size is None:
            missing.append(shard.index)
    return {"shards": len(index.shards), "complete": complete, "wrong_size": wrong, "compressed_copies": zipped,
            "shard_bytes": raw_bytes, "compressed_bytes": zip_bytes, "missing": missing,
            "dataset_raw_bytes": sum(s.raw_data.bytes for s in index.shards)}


def status(path: str, split: str | None = None) -> dict[str, Any]:
    """The status ``cache status`` prints, as plain data.

    Raises:
        CommandError: ``path`` is not a folder.
    """
    root = os.path.join(path, split) if split else path
    if not os.path.isdir(root):
        raise CommandError(f"{root}: no such cache folder (pass the `local` of a stream, and --split if it has one)")
    info = os.stat(root)
    out: dict[str, Any] = {"folder": os.path.realpath(root), "uid": info.st_uid, "mode": f"{info.st_mode & 0o777:04o}",
                           "origin": read_origin(root), "origin_file": ORIGIN_NAME}
    index_path = os.path.join(root, INDEX_NAME)
    out["index"] = _on_disk(root, Index.load(index_path)) if os.path.isfile(index_path) else None
    out["temporaries"] = [{"path": os.path.relpath(p, root), "pid": pid, "bytes": size, "writer_alive": pid_alive(pid)}
                          for p, pid, size in sorted(find_temporaries(root))]
    out["markers"] = [{"path": os.path.basename(m.path), "pid": m.pid, "run_alive": pid_alive(m.pid)}
                      for m in sorted(find_markers(root), key=lambda m: m.path)]
    plans = os.path.join(root, PLAN_FOLDER)
    out["plan_states"] = len(os.listdir(plans)) if os.path.isdir(plans) else 0
    out["agents"] = listening_agents()
    return out


def run_status(args: argparse.Namespace) -> int:
    """Print the status; exit code 0."""
    info = status(args.path, args.split)
    if args.json:
        print(json.dumps(info, indent=2))
        return 0
    print(f"folder       {info['folder']} (uid {info['uid']}, mode {info['mode']})")
    print(f"origin       {info['origin'] or f'none recorded ({ORIGIN_NAME} absent: not claimed by astream yet)'}")
    index = info["index"]
    if index is None:
        print(f"index        none ({INDEX_NAME} absent: no dataset has started in this folder)")
    else:
        print(f"shards       {index['complete']:,} of {index['shards']:,} complete"
              + (f", {index['wrong_size']:,} of the wrong size (checked again before use)" if index["wrong_size"] else ""))
        print(f"on disk      {format_size(index['shard_bytes'])} of {format_size(index['dataset_raw_bytes'])} raw"
              + (f", plus {index['compressed_copies']:,} compressed copies ({format_size(index['compressed_bytes'])})"
                 if index["compressed_copies"] else ""))
    temps = info["temporaries"]
    live = sum(t["writer_alive"] for t in temps)
    print(f"temporaries  {len(temps):,} ({live:,} being written, {len(temps) - live:,} of gone writers: the next "
          f"run removes those; {format_size(sum(t['bytes'] for t in temps))})")
    for t in temps:
        print(f"  {t['path']}  pid {t['pid']} {'alive' if t['writer_alive'] else 'gone'}  {format_size(t['bytes'])}")
    marks = info["markers"]
    print(f"markers      {len(marks):,} unsynced-run markers"
          + "".join(f"\n  {m['path']}  pid {m['pid']} {'alive' if m['run_alive'] else 'gone'}" for m in marks))
    print(f"plan states  {info['plan_states']:,}")
    agents = info["agents"]
    if agents is None:
        print("agents       unknown (this OS does not list its sockets)")
    else:
        print(f"agents       {len(agents):,} astream node agents listen on this machine; which folder each serves "
              "is not recorded (an agent's address hashes its job's run id)"
              + "".join(f"\n  {a}" for a in agents))
    return 0
