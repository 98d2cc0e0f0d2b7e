"""The node socket holds against a misbehaving client of the same user and a squatter of
another (issue 32, finding 12): epochs out of range are refused and change nothing; a
client that pinned an unknown key and leaves last lets the agent wind down; an abstract
name another user binds sends the node to its private socket file instead of ending the
job. Where the tests run as root, a second uid (65534) plays the other user."""

from __future__ import annotations

import asyncio
import contextlib
import os
import socket
import sys
import uuid
import warnings
from collections.abc import AsyncIterator, Iterator
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

import pytest

from astream._coord.agent import Agent
from astream._coord.client import AsyncNodeClient
from astream._coord.config import CoordConfig
from astream._coord.rendezvous import Address, derive_address, try_bind, try_connect
from astream._coord.wire import FrameDecoder, encode, validate_request
from astream._coord.world import World
from astream.errors import ConfigError, ProtocolError
from tests.coord.simple_provider import SimpleProviderFactory

CONFIG = CoordConfig(connect_timeout=5.0, barrier_timeout=5.0, agent_linger=0.2, agent_mode="thread")
OTHER_UID = 65534  # nobody


class KnownKeys:
    """A provider of shards "s0".."s3", that refuses other keys as the cache's provider does."""

    KEYS = frozenset(f"s{i}" for i in range(4))

    def __init__(self, root: str) -> None:
        self.root = root
        self.pins: dict[str, int] = {}

    def _known(self, key: str) -> None:
        if key not in self.KEYS:
            raise ConfigError(f"shard key {key!r}: there is no such shard")

    async def rebuild(self) -> None:
        return None

    def lookup(self, key: str) -> str | None:
        self._known(key)
        return None

    async def ensure(self, key: str, stage: Any) -> str:
        self._known(key)
        return os.path.join(self.root, key)

    def on_pins_changed(self, key: str, pins: int) -> None:
        self._known(key)
        self.pins[key] = pins

    def stats(self) -> dict[str, Any]:
        return {}

    async def aclose(self) -> None:
        return None


@dataclass
class Served:
    agent: Agent
    address: Address
    task: asyncio.Task[None]


@pytest.fixture
async def served(tmp_path: Path) -> AsyncIterator[Served]:
    address = derive_address(str(tmp_path), f"sec-{uuid.uuid4().hex[:8]}", abstract=CONFIG.abstract)
    listener = try_bind(address)
    assert listener is not None
    agent = Agent(KnownKeys(str(tmp_path)), replace(CONFIG, connect_timeout=30.0))
    ready = asyncio.Event()
    task = asyncio.create_task(agent.serve(listener, ready.set))
    await ready.wait()
    yield Served(agent, address, task)
    agent.stop()
    await task


async def _session(address: Address, *messages: dict[str, Any]) -> list[dict[str, Any]]:
    """Say hello, send ``messages``, and read answers until the agent has answered them or closed."""
    sock = try_connect(address)
    assert sock is not None
    reader, writer = await asyncio.open_unix_connection(sock=sock)
    hello = {"op": "hello", "id": 1, "member": "m", "pid": os.getpid(), "epoch_hint": None, "pins": []}
    frames: list[dict[str, Any]] = []
    decoder = FrameDecoder()
    try:
        for message in (hello, *messages):
            writer.write(encode(message))
        wanted = 1 + sum(1 for m in messages if "id" in m)
        while len(frames) < wanted:
            data = await asyncio.wait_for(reader.read(1 << 16), 5)
            if not data:
                break  # the agent closed the connection
            frames += decoder.feed(data)
    finally:
        writer.close()
        with contextlib.suppress(ConnectionError):
            await writer.wait_closed()
    return frames


@pytest.mark.parametrize("epoch", [-5, 10**30, 2**31, 1.5, True])
def test_epochs_out_of_range_are_not_messages(epoch: object) -> None:
    for message in ({"op": "set_epoch", "id": 2, "epoch": epoch},
                    {"op": "begin_epoch", "id": 2, "name": "e", "parties": 1, "timeout": 1.0, "epoch": epoch},
                    {"op": "hello", "id": 1, "member": "m", "pid": 1, "epoch_hint": epoch, "pins": []}):
        with pytest.raises(ProtocolError, match="epoch"):
            validate_request(message)
    with pytest.raises(ProtocolError, match="position"):
        validate_request({"op": "progress", "reader": "r", "position": -1})


@pytest.mark.parametrize("epoch", [-5, 10**30])
async def test_a_bad_set_epoch_changes_nothing(served: Served, epoch: int) -> None:
    frames = await _session(served.address, {"op": "set_epoch", "id": 2, "epoch": 4})
    assert frames[-1] == {"id": 2, "ok": True, "epoch": 4}
    frames = await _session(served.address, {"op": "set_epoch", "id": 2, "epoch": epoch})
    assert [f["id"] for f in frames] == [1]  # no answer: the connection is closed
    frames = await _session(served.address, {"op": "get_epoch", "id": 2})
    assert frames[-1]["epoch"] == 4
    assert served.agent.stats["protocol_errors"] == 1


@pytest.mark.parametrize("how", ["pin", "ensure", "hello"])
async def test_an_unknown_pin_does_not_keep_the_agent(served: Served, how: str) -> None:
    request = {"pin": {"op": "pin", "key": "nope"},
               "ensure": {"op": "ensure", "id": 2, "key": "nope", "pin": True},
               "hello": {"op": "pin", "key": "s1"}}[how]
    if how == "hello":  # a hello that carries the unknown pin (a client that rejoins)
        sock = try_connect(served.address)
        assert sock is not None
        reader, writer = await asyncio.open_unix_connection(sock=sock)
        writer.write(encode({"op": "hello", "id": 1, "member": "m", "pid": 1, "epoch_hint": None, "pins": ["nope"]}))
        answer = FrameDecoder().feed(await asyncio.wait_for(reader.read(1 << 16), 5))
        assert answer[0]["ok"] is False
        writer.close()
    else:
        frames = await _session(served.address, request)
        if how == "ensure":
            assert frames[-1]["ok"] is False
            assert "no such shard" in frames[-1]["error"]["message"]
    # It was the last client: the agent ends after its linger (0.2 s), it does not stay forever.
    await asyncio.wait_for(asyncio.shield(served.task), 10)


@contextlib.contextmanager
def _as_other_user(target: Any, *args: Any) -> Iterator[int]:
    """Run ``target(ready_fd, *args)`` in a forked child under uid 65534 while the block runs.

    The child writes one byte to ``ready_fd`` (its verdict, or that it is ready); the
    parent reads it before the block. Forked (no exec: the interpreter may live where
    that user cannot read), the child only makes socket calls and exits.
    """
    read, write = os.pipe()
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)  # fork in a threaded process (3.12+)
        pid = os.fork()
    if pid == 0:  # the child: no return from here
        try:
            os.close(read)
            os.setgid(OTHER_UID)
            os.setuid(OTHER_UID)
            target(write, *args)
        finally:
            os._exit(0)
    os.close(write)
    try:
        yield read
    finally:
        os.close(read)
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, 9)
        os.waitpid(pid, 0)


def _squat(ready: int, name: str) -> None:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.bind(name)
    sock.listen(8)
    os.write(ready, b"+")
    while True:
        with contextlib.suppress(OSError):
            sock.accept()[0].close()


needs_root = pytest.mark.skipif(
    not sys.platform.startswith("linux") or os.geteuid() != 0,
    reason="another user is played by uid 65534, which only root can become (and abstract names are Linux's)",
)


@needs_root
async def test_a_squatted_abstract_name_falls_back_to_the_private_socket(tmp_path: Path) -> None:
    remote, local = tmp_path / "remote", tmp_path / "local"
    remote.mkdir()
    (remote / "shard.00000.mds").write_bytes(b"x" * 100)
    run_id = f"sec-{uuid.uuid4().hex[:8]}"
    config = replace(CONFIG, namespace="abstract")
    address = derive_address(str(local), run_id, abstract=True)
    with _as_other_user(_squat, address.name) as ready:
        assert os.read(ready, 1) == b"+", "the other user's process did not bind the name"
        clients = [AsyncNodeClient(str(local), SimpleProviderFactory(str(remote), str(local)), run_id=run_id,
                                   member=f"rank{i}", world=World(), config=config) for i in range(2)]
        try:
            paths = [await c.ensure("shard.00000.mds") for c in clients]
            assert paths[0] == paths[1]
            assert clients[0].started_agents + clients[1].started_agents == 1  # one agent, both joined it
            assert [c.address for c in clients] == [address.private()] * 2
        finally:
            for c in clients:
                await c.aclose()


def _knock(verdict: int, name: str, hello: bytes) -> None:
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.settimeout(5)
    sock.connect(name)
    try:
        sock.sendall(hello)
        answer = sock.recv(1 << 16)
    except OSError:  # reset: refused at once
        answer = b""
    os.write(verdict, b"+" if not answer else b"!")  # "+": closed without an answer


@needs_root
async def test_another_user_cannot_join(served: Served) -> None:
    hello = encode({"op": "hello", "id": 1, "member": "intruder", "pid": 1, "epoch_hint": None, "pins": []})
    with _as_other_user(_knock, served.address.name, hello) as verdict:
        assert await asyncio.to_thread(os.read, verdict, 1) == b"+"
    assert served.agent.stats["op_hello"] == 0
