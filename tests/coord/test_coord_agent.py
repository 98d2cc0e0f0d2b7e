"""The node agent and its client in one process: ensure, pins, barriers, epoch, hygiene, watchdog."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import socket
import stat
import tempfile
from collections.abc import AsyncIterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest
from coordkit import GateProvider

from astream._coord.agent import Agent
from astream._coord.client import AsyncNodeClient
from astream._coord.config import CoordConfig
from astream._coord.rendezvous import Address, derive_address, try_bind, try_connect
from astream._coord.watchdog import WatchdogTimeout
from astream._coord.wire import HEADER, FrameDecoder, encode
from astream._coord.world import World
from astream.errors import BarrierTimeout, ConfigError, CoordinationError, DownloadError, UsageError
from tests.coord.simple_provider import SimpleProvider, SimpleProviderFactory


def _no_factory() -> Any:
    raise AssertionError("the test's agent is already running; no client may start one")


@dataclass
class Node:
    agent: Agent
    provider: GateProvider
    address: Address
    local: str
    run_id: str
    config: CoordConfig
    clients: list[AsyncNodeClient]

    def client(self, member: str, **overrides: Any) -> AsyncNodeClient:
        client = AsyncNodeClient(self.local, _no_factory, run_id=self.run_id, member=member, world=World(),
                                 config=replace(self.config, **overrides))
        self.clients.append(client)
        return client


@pytest.fixture
async def node(tmp_path: Path, run_id: str, config: CoordConfig) -> AsyncIterator[Node]:
    """An agent with a GateProvider, serving in the test's own loop."""
    config = replace(config, agent_linger=60.0, connect_timeout=3.0)
    provider = GateProvider(str(tmp_path))
    address = derive_address(str(tmp_path), run_id, abstract=config.abstract)
    listener = try_bind(address)
    assert listener is not None
    agent = Agent(provider, config)
    ready = asyncio.Event()
    task = asyncio.create_task(agent.serve(listener, ready.set))
    await ready.wait()
    node = Node(agent, provider, address, str(tmp_path), run_id, config, [])
    yield node
    for client in node.clients:
        await client.aclose()
    agent.stop()
    await task
    assert provider.closed == 1


async def raw_connect(address: Address) -> tuple[asyncio.StreamReader, asyncio.StreamWriter]:
    sock = try_connect(address)  # uvloop cannot connect to an abstract name by itself
    assert sock is not None
    return await asyncio.open_unix_connection(sock=sock)


async def read_frames(reader: asyncio.StreamReader) -> list[dict[str, Any]]:
    """Every frame until the agent closes the connection."""
    data = await asyncio.wait_for(reader.read(), 5)
    return FrameDecoder().feed(data) if data else []


async def test_ensure_downloads_once_and_answers_every_waiter(node: Node) -> None:
    clients = [node.client(f"c{i}") for i in range(5)]
    waits = [asyncio.ensure_future(c.ensure("s0", pin=True)) for c in clients]
    await asyncio.sleep(0.1)
    assert node.provider.calls["s0"] == 1
    assert (await clients[0].stats())["inflight"] == ["s0"]
    node.provider.gate("s0").set()
    paths = await asyncio.gather(*waits)
    assert paths == [os.path.join(node.local, "s0")] * 5
    assert node.provider.calls["s0"] == 1
    assert node.provider.pins["s0"] == 5
    assert await clients[1].ensure("s0", pin=True) == paths[0]  # held pinned: answered by the client itself
    assert await node.client("fresh").ensure("s0") == paths[0]  # cached: answered from lookup
    stats = await clients[0].stats()
    assert (stats["op_ensure"], stats["fetches"], stats["coalesced"], stats["hits"]) == (6, 1, 4, 1)
    assert node.provider.pins["s0"] == 5  # the agent counts each client once per key
    await clients[1].unpin("s0")
    await clients[1].unpin("s0")
    await clients[0].stats()
    assert node.provider.pins["s0"] == 4


async def test_ensure_error_reaches_every_waiter_and_unpins(node: Node) -> None:
    node.provider.errors["bad"] = DownloadError("shard 'bad': http://x/bad answered HTTP 500")
    clients = [node.client(f"c{i}") for i in range(3)]
    waits = [asyncio.ensure_future(c.ensure("bad", pin=True)) for c in clients]
    await asyncio.sleep(0.05)
    node.provider.gate("bad").set()
    results = await asyncio.gather(*waits, return_exceptions=True)
    assert all(isinstance(r, DownloadError) and "HTTP 500" in str(r) for r in results)
    assert node.provider.calls["bad"] == 1
    await asyncio.sleep(0.05)
    assert (await clients[0].stats())["pins"] == 0
    del node.provider.errors["bad"]  # a later ensure tries again
    assert await clients[0].ensure("bad")
    assert node.provider.calls["bad"] == 2


async def test_ensure_many_one_round_trip(node: Node) -> None:
    node.provider.present.update({"a", "b"})
    client = node.client("c")
    waiting = asyncio.ensure_future(client.ensure_many(["a", "x", "b", "x", "y"], pin=True))
    await asyncio.sleep(0.05)
    assert not waiting.done()
    node.provider.gate("x").set()
    await asyncio.sleep(0.05)
    assert not waiting.done()  # still waits for y
    node.provider.gate("y").set()
    paths = await waiting
    assert [os.path.basename(p) for p in paths] == ["a", "x", "b", "x", "y"]
    assert node.provider.pins == {"a": 1, "b": 1, "x": 1, "y": 1}
    stats = await client.stats()
    assert (stats["op_ensure_many"], stats["fetches"]) == (1, 2)
    assert await client.ensure_many(["a", "b"], pin=True) == paths[::2][:2]  # held: no round trip
    assert (await client.stats())["op_ensure_many"] == 1
    for key in ["a", "x", "b", "x", "y", "a", "b"]:
        await client.unpin(key)
    await client.stats()
    assert set(node.provider.pins.values()) == {0}


async def test_ensure_many_fails_at_first_error(node: Node) -> None:
    node.provider.errors["bad"] = DownloadError("shard 'bad' is gone")
    node.provider.gate("bad").set()
    client = node.client("c")
    with pytest.raises(DownloadError, match="gone"):
        await client.ensure_many(["ok", "bad"], pin=True)
    await client.stats()
    assert set(node.provider.pins.values()) == {0}


async def test_a_failed_fetch_warns_only_where_someone_waits(node: Node, caplog: pytest.LogCaptureFixture) -> None:
    node.provider.errors["pre"] = DownloadError("shard 'pre' is gone")
    node.provider.errors["asked"] = DownloadError("shard 'asked' is gone")
    client = node.client("c")
    with caplog.at_level(logging.DEBUG, logger="astream.coord"):
        await client.prefetch(["pre"])
        await client.stats()  # (the one-way message went first)
        node.provider.gate("pre").set()
        await asyncio.sleep(0.05)
        node.provider.gate("asked").set()
        with pytest.raises(DownloadError, match="gone"):
            await client.ensure("asked")
    levels = {r.getMessage().split("'")[1]: r.levelno for r in caplog.records if "failed for" in r.getMessage()}
    assert levels == {"pre": logging.DEBUG, "asked": logging.WARNING}


async def test_prefetch_starts_downloads_an_ensure_then_joins(node: Node) -> None:
    node.provider.errors["bad"] = DownloadError("shard 'bad' is gone")
    client = node.client("c")
    await client.prefetch(["p1", "p2", "bad"])
    await client.stats()  # the one-way message went first
    assert dict(node.provider.calls) == {"p1": 1, "p2": 1, "bad": 1}
    waiting = asyncio.ensure_future(client.ensure("p1"))
    await asyncio.sleep(0.05)  # joins the download in flight
    for key in ("p1", "p2", "bad"):
        node.provider.gate(key).set()
    assert (await waiting).endswith("p1")
    await client.prefetch(["p1", "p2"])  # present now: nothing to do
    stats = await client.stats()
    assert (stats["prefetches"], stats["fetches"], stats["coalesced"]) == (3, 3, 1)
    del node.provider.errors["bad"]
    assert await client.ensure("bad")  # a failed prefetch is forgotten; ensure tries again
    assert node.provider.calls["bad"] == 2


async def test_pins_released_when_a_client_vanishes(node: Node) -> None:
    node.provider.present.update({"a", "b"})
    holder, watcher = node.client("holder"), node.client("watcher")
    await holder.ensure("a", pin=True)
    await holder.pin("b")
    await holder.pin("b")
    await holder.unpin("b")
    async with watcher.pinned("a") as path:
        assert path.endswith("a")
        stats = await watcher.stats()
        assert stats["pins"] == 3
        assert node.provider.pins == {"a": 2, "b": 1}
    assert holder._link is not None
    assert holder._link.transport is not None
    holder._link.closing = True  # as if its process died: no goodbye, no rejoin
    holder._link.transport.abort()
    for _ in range(50):
        if (await watcher.stats())["pins"] == 0:
            break
        await asyncio.sleep(0.02)
    assert node.provider.pins == {"a": 0, "b": 0}


async def test_barrier_and_epoch(node: Node) -> None:
    members = ["r0", "r1", "r2"]
    clients = [node.client(m) for m in members]
    await asyncio.gather(*(c.barrier("start", members, timeout=5) for c in clients))
    assert await asyncio.gather(*(c.begin_epoch(members) for c in clients)) == [0, 0, 0]
    assert await asyncio.gather(*(c.begin_epoch(3) for c in clients)) == [1, 1, 1]
    await clients[0].set_epoch(7)
    assert await clients[2].get_epoch() == 7
    assert await asyncio.gather(*(c.begin_epoch(members) for c in clients)) == [7, 7, 7]
    assert await clients[1].get_epoch() == 8
    # A resume sets the epoch in its arrival (every rank the same, as each sets it first).
    assert await asyncio.gather(*(c.begin_epoch(members, resume_epoch=3) for c in clients)) == [3, 3, 3]
    assert await clients[0].get_epoch() == 4
    assert await asyncio.gather(clients[0].begin_epoch(members, resume_epoch=2), clients[1].begin_epoch(members),
                                clients[2].begin_epoch(members)) == [2, 2, 2]


async def test_barrier_timeout_names_the_missing(node: Node) -> None:
    a = node.client("rank0.worker0")
    with pytest.raises(BarrierTimeout, match=r"missing rank1\.worker0"):
        await a.barrier("sync", ["rank0.worker0", "rank1.worker0"], timeout=0.3)
    # default parties: every worker of the node from the World
    world = World(rank=0, world_size=2, local_rank=0, ranks_per_node=2)
    b = AsyncNodeClient(node.local, _no_factory, run_id=node.run_id, world=world, config=node.config)
    node.clients.append(b)
    with pytest.raises(BarrierTimeout, match=r"missing rank1\.worker0"):
        await b.barrier("sync2", timeout=0.3)


async def test_watchdog_names_shard_stage_and_waiters(node: Node, caplog: pytest.LogCaptureFixture) -> None:
    client = node.client("rank5.worker1", watch_warn_after=0.1, watch_fail_after=0.5)
    with caplog.at_level(logging.WARNING, logger="astream.coord"), \
            pytest.raises(WatchdogTimeout, match=r"shard 'slow'.*stage 'download'.*rank5\.worker1"):
        await client.ensure("slow")
    assert any("waited 0s on shard 'slow'" in r.getMessage() for r in caplog.records)
    assert isinstance(WatchdogTimeout("x"), TimeoutError)


async def test_watchdog_names_missing_barrier_parties(node: Node) -> None:
    client = node.client("a", watch_warn_after=0.1, watch_fail_after=0.4)
    with pytest.raises(WatchdogTimeout, match=r"barrier 'sync'.*arrived a; missing b, c"):
        await client.barrier("sync", ["a", "b", "c"], timeout=30)


async def test_version_mismatch_is_a_clear_error(node: Node) -> None:
    reader, writer = await raw_connect(node.address)
    writer.write(encode({"op": "hello", "id": 1}, version=9))
    data = await asyncio.wait_for(reader.read(), 5)
    writer.close()
    _magic, version, _length = HEADER.unpack_from(data)
    assert version == 1
    assert b"v9" in data
    assert b"same astream version" in data


async def test_client_of_other_version_gets_clear_error(tmp_path: Path, run_id: str, config: CoordConfig) -> None:
    address = derive_address(str(tmp_path), run_id, abstract=config.abstract)
    listener = try_bind(address)
    assert listener is not None

    async def future_agent(reader: asyncio.StreamReader, writer: asyncio.StreamWriter) -> None:
        await reader.read(8)
        writer.write(encode({"id": 1, "ok": True}, version=2))
        await writer.drain()
        writer.close()

    server = await asyncio.start_unix_server(future_agent, sock=listener)
    try:
        client = AsyncNodeClient(str(tmp_path), _no_factory, run_id=run_id, world=World(), config=config)
        with pytest.raises(CoordinationError, match=r"protocol v2, this process v1.*same astream version"):
            await client.aconnect()
        await client.aclose()
    finally:
        server.close()
        await server.wait_closed()


@pytest.mark.parametrize(
    "garbage",
    [b"GET / HTTP/1.0\r\n\r\n", HEADER.pack(b"AS", 1, 1 << 30), encode({"op": "ensure", "id": 1}),
     encode({"op": "ensure", "id": 1, "key": "k", "pin": False}), b"AS\x01\x00\x00\x00\x00\x02[]"],
    ids=["http", "oversized", "schema", "before-hello", "not-object"],
)
async def test_malformed_frame_closes_only_that_connection(node: Node, garbage: bytes) -> None:
    good = node.client("good")
    node.provider.present.add("x")
    await good.ensure("x")
    reader, writer = await raw_connect(node.address)
    writer.write(garbage)
    assert await asyncio.wait_for(reader.read(), 5) == b""  # closed, no answer
    writer.close()
    assert await good.ensure("x")  # everyone else carries on
    assert (await good.stats())["protocol_errors"] == 1


async def test_other_users_are_refused(node: Node) -> None:
    node.agent.allowed_uid = os.getuid() + 1  # as if we were someone else
    reader, writer = await raw_connect(node.address)
    writer.write(encode({"op": "hello", "id": 1, "member": "m", "pid": 1, "epoch_hint": None, "pins": []}))
    with contextlib.suppress(ConnectionResetError):  # aborted: no answer, closed at once
        assert await asyncio.wait_for(reader.read(), 5) == b""
    writer.close()
    node.agent.allowed_uid = os.getuid()
    assert (await node.client("other").stats())["op_hello"] == 1  # only that one's hello got in


async def test_agent_loss_rejoins_at_once_and_new_agent_learns_epoch(
    tmp_path: Path, run_id: str, config: CoordConfig
) -> None:
    address = derive_address(str(tmp_path), run_id, abstract=config.abstract)
    listener = try_bind(address)
    assert listener is not None
    agent = Agent(GateProvider(str(tmp_path)), replace(config, agent_linger=30.0))
    ready = asyncio.Event()
    task = asyncio.create_task(agent.serve(listener, ready.set))
    await ready.wait()
    successor = GateProvider(str(tmp_path))
    client_config = replace(config, agent_mode="thread", agent_linger=0.1)
    async with AsyncNodeClient(str(tmp_path), lambda: successor, run_id=run_id, world=World(),
                               config=client_config) as client:
        assert [await client.begin_epoch(1) for _ in range(3)] == [0, 1, 2]
        await client.pin("held")
        assert client.started_agents == 0
        agent.stop()  # the agent goes away while this client is idle...
        await task
        for _ in range(100):  # ...and the client elects a new one by itself, with its pins
            if client.started_agents == 1 and successor.pins:
                break
            await asyncio.sleep(0.02)
        assert successor.pins == {"held": 1}
        assert successor.rebuilt == 1
        assert await client.get_epoch() == 3  # learnt from the client's hello


async def test_closed_client_refuses_and_unclosed_warns(node: Node) -> None:
    client = node.client("c")
    await client.aconnect()
    await client.aclose()
    await client.aclose()  # idempotent
    with pytest.raises(UsageError, match="closed"):
        await client.get_epoch()
    forgotten = AsyncNodeClient(node.local, _no_factory, run_id=node.run_id, world=World(), config=node.config)
    await forgotten.aconnect()
    with pytest.warns(ResourceWarning, match="unclosed"):
        forgotten.__del__()
    forgotten._closed = True


@pytest.fixture
def short_runtime_dir(monkeypatch: pytest.MonkeyPatch) -> Any:
    folder = tempfile.mkdtemp(prefix="ast", dir="/tmp")
    monkeypatch.setenv("XDG_RUNTIME_DIR", folder)
    yield folder
    for name in os.listdir(os.path.join(folder, "astream")) if os.path.isdir(os.path.join(folder, "astream")) else []:
        os.unlink(os.path.join(folder, "astream", name))
    if os.path.isdir(os.path.join(folder, "astream")):
        os.rmdir(os.path.join(folder, "astream"))
    os.rmdir(folder)


async def test_filesystem_socket_thread_agent(
    tmp_path: Path, run_id: str, config: CoordConfig, short_runtime_dir: str, remote: tuple[Path, dict[str, str]]
) -> None:
    folder, digests = remote
    config = replace(config, namespace="filesystem", agent_mode="thread", agent_linger=0.1)
    local = tmp_path / "cache"
    factory = SimpleProviderFactory(str(folder), str(local))
    address = derive_address(str(local), run_id, abstract=False)
    # a socket file left by a dead run: nobody accepts on it
    os.makedirs(os.path.dirname(address.name), mode=0o700, exist_ok=True)
    stale = socket.socket(socket.AF_UNIX)
    stale.bind(address.name)
    stale.close()
    async with AsyncNodeClient(str(local), factory, run_id=run_id, world=World(), config=config) as client:
        assert client.started_agents == 1  # reclaimed the stale socket
        path = await client.ensure(sorted(digests)[0])
        assert await asyncio.to_thread(Path(path).read_bytes)
        assert stat.S_IMODE(os.stat(address.name).st_mode) == 0o600
        assert stat.S_IMODE(os.stat(os.path.dirname(address.name)).st_mode) == 0o700
    socket_file = Path(address.name)
    for _ in range(100):
        if not await asyncio.to_thread(socket_file.exists):
            break
        await asyncio.sleep(0.02)
    assert not await asyncio.to_thread(socket_file.exists), "the agent removes its socket file when it leaves"


async def test_simple_provider_rebuild_and_keys(tmp_path: Path, remote: tuple[Path, dict[str, str]]) -> None:
    folder, _digests = remote
    local = tmp_path / "cache"
    (local / "sub").mkdir(parents=True)
    (local / "sub" / ".shard.00001.mds.astream-tmp-abc").write_bytes(b"partial")
    (local / "shard.00000.mds").write_bytes((folder / "shard.00000.mds").read_bytes())
    provider = SimpleProvider(str(folder), str(local))
    await provider.rebuild()
    assert provider.lookup("shard.00000.mds") == str(local / "shard.00000.mds")
    assert provider.lookup("shard.00001.mds") is None
    assert not list(local.rglob("*astream-tmp*"))
    assert provider.stats()["removed_partials"] == 1
    for key in ("../etc/passwd", "/etc/passwd", "."):
        with pytest.raises(ConfigError, match="relative path"):
            await provider.ensure(key, lambda stage: None)
    await provider.ensure("shard.00002.mds", lambda stage: None)
    assert provider.stats()["downloads"] == 1
    await provider.aclose()


async def test_twin_names_warn_only_at_barriers(node: Node, caplog: pytest.LogCaptureFixture) -> None:
    """Two clients under one name are harmless until one waits at a barrier (then: one warning)."""
    first, second = node.client("rank0.worker0"), node.client("rank0.worker0")
    with caplog.at_level(logging.WARNING):
        await first.aconnect()  # a stand-in and its worker process, say: no barrier, no warning
        await second.aconnect()
        assert not [r for r in caplog.records if "joined under that name" in r.getMessage()]
        with pytest.raises(BarrierTimeout):
            await first.barrier("sync", ["rank0.worker0", "rank1.worker0"], timeout=0.2)
        with pytest.raises(BarrierTimeout):
            await first.barrier("sync2", ["rank0.worker0", "rank1.worker0"], timeout=0.2)
    twins = [r for r in caplog.records if "joined under that name" in r.getMessage()]
    assert len(twins) == 1
    assert "rank0.worker0" in twins[0].getMessage()
