"""Helpers of the coordination tests: shards, a counting loopback HTTP server, rank processes."""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import json
import os
import signal
import sys
import time
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from astream._coord.config import CoordConfig
from astream._coord.rendezvous import derive_address, try_bind
from astream.testing import Fault, LoopbackServer

HERE = Path(__file__).resolve().parent
RANK_SCRIPT = HERE / "rank_proc.py"

# Short real timeouts: these tests run on 2 shared cores.
FAST = CoordConfig(connect_timeout=15.0, barrier_timeout=20.0, watch_warn_after=5.0, watch_fail_after=30.0,
                   agent_linger=0.3)


def make_shards(root: Path, count: int, size: int = 4096) -> dict[str, str]:
    """``count`` shard files of random bytes under ``root``; returns key -> sha256."""
    root.mkdir(parents=True, exist_ok=True)
    digests = {}
    for i in range(count):
        data = os.urandom(size)
        key = f"shard.{i:05d}.mds"
        (root / key).write_bytes(data)
        digests[key] = hashlib.sha256(data).hexdigest()
    return digests


def counts(server: LoopbackServer, keys: list[str]) -> dict[str, int]:
    """GET requests the loopback server saw for each key."""
    return {key: server.count(key) for key in keys}


def slow_down(server: LoopbackServer, seconds: float) -> None:
    """Delay every answer, so requests for one shard overlap."""
    server.add(Fault("delay", times=None, seconds=seconds))


def shm_paths(pids: list[int]) -> set[str]:
    """The /dev/shm objects the processes ``pids`` map or hold open (others' tests may use /dev/shm)."""
    found: set[str] = set()
    for pid in pids:
        try:
            with open(f"/proc/{pid}/maps") as maps:
                found.update(line.split()[-1] for line in maps if "/dev/shm/" in line)
            for fd in os.listdir(f"/proc/{pid}/fd"):
                with contextlib.suppress(OSError):
                    target = os.readlink(f"/proc/{pid}/fd/{fd}")
                    if target.startswith("/dev/shm/"):
                        found.add(target)
        except FileNotFoundError:
            continue  # exited meanwhile
    return found


def _listening(name: str) -> bool:
    if name.startswith("\0"):
        wanted = "@" + name[1:]
        with open("/proc/net/unix") as f:
            return any(line.split()[-1] == wanted for line in f.readlines()[1:] if len(line.split()) >= 8)
    return os.path.exists(name)


def assert_clean(local: Path, run_id: str, config: CoordConfig, *, wait: float = 10.0) -> None:
    """Nothing is left: the agent address is free, no partial file in the cache."""
    address = derive_address(str(local), run_id, abstract=config.abstract)
    deadline = time.monotonic() + wait
    while _listening(address.name):  # watch without connecting: a probe would keep the agent alive
        assert time.monotonic() < deadline, f"an agent still listens at {address}"
        time.sleep(0.05)
    listener = try_bind(address)
    assert listener is not None, f"{address} is still bound"
    listener.close()
    if not address.abstract:
        os.unlink(address.name)
    leftovers = [p.name for p in local.rglob("*") if ".astream-tmp-" in p.name]
    assert not leftovers, f"partial downloads left in the cache: {leftovers}"


@dataclass
class RankProc:
    """A rank/worker process running tests/coord/rank_proc.py, its JSON lines collected."""

    proc: asyncio.subprocess.Process
    spec: dict[str, Any]
    lines: list[dict[str, Any]] = field(default_factory=list)
    reader: asyncio.Task[None] | None = None

    async def _read(self) -> None:
        assert self.proc.stdout is not None
        async for raw in self.proc.stdout:
            self.lines.append(json.loads(raw))

    def events(self, kind: str) -> list[dict[str, Any]]:
        return [line for line in self.lines if line.get("event") == kind]

    async def wait_for(self, kind: str, count: int = 1, timeout: float = 30.0) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while len(self.events(kind)) < count:
            if self.proc.returncode is not None and self.reader is not None and self.reader.done():
                raise AssertionError(f"{self.spec['member']} exited ({self.proc.returncode}) before {kind}: {self.lines}")
            assert time.monotonic() < deadline, f"{self.spec['member']}: no {kind} in {timeout}s: {self.lines}"
            await asyncio.sleep(0.02)
        return self.events(kind)[count - 1]

    def kill(self) -> None:
        if self.proc.returncode is None:
            os.kill(self.proc.pid, signal.SIGKILL)

    async def finish(self, timeout: float = 60.0) -> int:
        await asyncio.wait_for(self.proc.wait(), timeout)
        if self.reader is not None:
            await asyncio.wait_for(self.reader, 5)
        return self.proc.returncode  # type: ignore[return-value]


async def start_rank(spec: dict[str, Any], log_dir: Path) -> RankProc:
    """Start one rank process with ``spec`` (see rank_proc.py)."""
    err = open(log_dir / f"{spec['member']}.err", "wb")  # noqa: SIM115, ASYNC230 - tiny, the child owns it
    try:
        proc = await asyncio.create_subprocess_exec(
            sys.executable, str(RANK_SCRIPT), json.dumps(spec),
            stdout=asyncio.subprocess.PIPE, stderr=err, stdin=asyncio.subprocess.DEVNULL,
        )
    finally:
        err.close()
    rank = RankProc(proc, spec)
    rank.reader = asyncio.get_running_loop().create_task(rank._read())
    return rank


def config_dict(config: CoordConfig) -> dict[str, Any]:
    return {k: getattr(config, k) for k in config.__dataclass_fields__}


class GateProvider:
    """A fake ShardProvider whose downloads wait until the test opens their gate."""

    def __init__(self, root: str) -> None:
        self.root = root
        self.calls: Counter[str] = Counter()
        self.gates: dict[str, asyncio.Event] = {}
        self.errors: dict[str, Exception] = {}
        self.present: set[str] = set()
        self.pins: dict[str, int] = {}
        self.rebuilt = 0
        self.closed = 0

    def gate(self, key: str) -> asyncio.Event:
        return self.gates.setdefault(key, asyncio.Event())

    async def rebuild(self) -> None:
        self.rebuilt += 1

    def lookup(self, key: str) -> str | None:
        return os.path.join(self.root, key) if key in self.present else None

    async def ensure(self, key: str, stage: Any) -> str:
        self.calls[key] += 1
        stage("download")
        await self.gate(key).wait()
        if key in self.errors:
            raise self.errors[key]
        self.present.add(key)
        return os.path.join(self.root, key)

    def on_pins_changed(self, key: str, pins: int) -> None:
        self.pins[key] = pins

    def stats(self) -> dict[str, Any]:
        return {"calls": sum(self.calls.values())}

    async def aclose(self) -> None:
        self.closed += 1
