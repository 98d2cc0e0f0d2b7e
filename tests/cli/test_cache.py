"""``astream cache status``: a folder a real stream filled, its leftovers, and agents listening."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

from clikit import NUM_SAMPLES, Run, assert_one_line_error

from astream._cache.durability import MARKER_PREFIX
from astream._cache.install import temp_name
from astream._format.index import Index
from astream.testing import LoopbackServer


def _snapshot(folder: Path) -> list[tuple[str, int, int]]:
    return sorted((str(p.relative_to(folder)), p.stat().st_size, p.stat().st_mtime_ns) for p in folder.rglob("*"))


def _fill(dataset: Path, local: Path) -> str:
    """Stream every sample from a loopback server into ``local`` in a job of its own (which
    has exited, its agent with it, when this returns); returns the remote."""
    job = ("import sys; from astream import StreamingDataset; "
           "ds = StreamingDataset(remote=sys.argv[1], local=sys.argv[2], batch_size=4, shuffle=True); "
           "print(sum(1 for _ in ds)); ds.close()")
    with LoopbackServer(str(dataset)) as server:
        done = subprocess.run([sys.executable, "-c", job, server.url, str(local)], capture_output=True, text=True,
                              timeout=120, check=False)
        assert done.returncode == 0, done.stderr
        assert int(done.stdout) == NUM_SAMPLES
        return server.url


def test_status_reports_a_filled_folder_and_its_leftovers_without_changing_it(
    cli: Run, main: Run, dataset: Path, tmp_path: Path
) -> None:
    local = tmp_path / "cache"
    remote = _fill(dataset, local)
    index = Index.load(dataset / "index.json")
    # What crashed and running jobs leave: a shard cut short, temporaries of a gone and of
    # a live writer (this process), the marker of a gone run.
    dead = int(subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True,
                              text=True, check=True).stdout)
    first = local / index.shards[0].raw_data.basename
    first.write_bytes(first.read_bytes()[:10])
    (local / f"{index.shards[1].raw_data.basename}.{dead}.0badc0de.tmp").write_bytes(b"x" * 7)
    live = Path(temp_name(str(local / index.shards[2].raw_data.basename)))
    live.write_bytes(b"y" * 5)
    (local / f"{MARKER_PREFIX}{dead}.0badc0de").touch()
    before = _snapshot(local)

    result = main("cache", "status", str(local), "--json")
    assert result.returncode == 0, result.stderr
    info = json.loads(result.stdout)
    assert info["folder"] == os.path.realpath(local)
    assert info["origin"] == remote
    assert info["index"]["shards"] == len(index.shards)
    assert info["index"]["complete"] == len(index.shards) - 1
    assert info["index"]["wrong_size"] == 1
    assert info["index"]["missing"] == []
    assert info["index"]["shard_bytes"] == sum(s.raw_data.bytes for s in index.shards[1:]) + 10
    assert sorted((t["bytes"], t["writer_alive"]) for t in info["temporaries"]) == [(5, True), (7, False)]
    assert [(m["pid"], m["run_alive"]) for m in info["markers"]] == [(dead, False)]
    assert info["plan_states"] >= 1
    assert isinstance(info["agents"], list)
    assert _snapshot(local) == before  # read-only

    text = cli("cache", "status", str(local))
    assert text.returncode == 0, text.stderr
    assert f"origin       {remote}" in text.stdout
    assert f"shards       {len(index.shards) - 1} of {len(index.shards)} complete, 1 of the wrong size" in text.stdout
    assert f"pid {dead} gone" in text.stdout
    assert _snapshot(local) == before


def test_status_lists_the_agents_listening_on_the_machine(main: Run, tmp_path: Path) -> None:
    name = f"astream-{os.urandom(12).hex()}"
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.bind("\0" + name)  # what a node agent listens on (rendezvous.derive_address)
        sock.listen(1)
        result = main("cache", "status", str(tmp_path), "--json")
        assert result.returncode == 0, result.stderr
        assert f"@{name}" in json.loads(result.stdout)["agents"]
    result = main("cache", "status", str(tmp_path), "--json")
    assert f"@{name}" not in json.loads(result.stdout)["agents"]


def test_status_of_an_empty_folder_and_of_no_folder(main: Run, tmp_path: Path) -> None:
    result = main("cache", "status", str(tmp_path))
    assert result.returncode == 0, result.stderr
    assert "origin       none recorded" in result.stdout
    assert "index        none" in result.stdout
    assert_one_line_error(main("cache", "status", str(tmp_path / "nowhere")), 1, "nowhere", "no such cache folder")
    assert_one_line_error(main("cache"), 2, "cache")
