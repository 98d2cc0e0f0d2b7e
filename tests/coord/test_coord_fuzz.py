"""Hypothesis against a live agent: whatever bytes a connection sends, only it is closed."""

from __future__ import annotations

import socket
import threading
import uuid
from collections.abc import Iterator
from pathlib import Path

import pytest
from coordkit import FAST, GateProvider
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from astream._coord.launch import run_agent
from astream._coord.rendezvous import Address, derive_address, try_bind
from astream._coord.wire import HEADER, MAGIC, PROTOCOL_VERSION, FrameDecoder, encode

HELLO = {"op": "hello", "member": "probe", "pid": 1, "epoch_hint": None, "pins": []}


@pytest.fixture(scope="module")
def live_agent(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Address]:
    """An agent on its own loop thread for the whole module."""
    root: Path = tmp_path_factory.mktemp("fuzz")
    address = derive_address(str(root), f"fuzz-{uuid.uuid4().hex[:8]}", abstract=FAST.abstract)
    listener = try_bind(address)
    assert listener is not None
    ready = threading.Event()
    agents: list[object] = []

    def serve() -> None:
        run_agent(listener, lambda: agents.append(GateProvider(str(root))) or agents[-1], FAST, ready.set)  # type: ignore[arg-type, func-returns-value]

    thread = threading.Thread(target=serve, daemon=True)
    thread.start()
    assert ready.wait(10)
    # A member stays connected for the whole module: between two examples (slow on a busy
    # machine) the agent would otherwise see no client for agent_linger and shut down.
    keeper = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    keeper.settimeout(10)
    keeper.connect(address.name)
    keeper.sendall(encode({**HELLO, "member": "keeper", "id": 1}))
    assert FrameDecoder().feed(keeper.recv(65536))[0]["ok"]
    yield address
    keeper.close()
    thread.join(10)  # the agent leaves agent_linger after its last client, by itself
    assert not thread.is_alive()


def _talk(address: Address, payload: bytes) -> bytes:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as sock:
        sock.settimeout(5)
        sock.connect(address.name)
        try:
            sock.sendall(payload)
            sock.shutdown(socket.SHUT_WR)
        except (BrokenPipeError, ConnectionResetError):
            return b""  # closed on us already: fine
        chunks = []
        try:
            while chunk := sock.recv(65536):
                chunks.append(chunk)
        except ConnectionResetError:
            pass
        return b"".join(chunks)


def _still_serves(address: Address) -> None:
    answer = _talk(address, encode({**HELLO, "id": 1}) + encode({"op": "get_epoch", "id": 2}))
    replies = FrameDecoder().feed(answer)
    assert [r["id"] for r in replies] == [1, 2]
    assert all(r["ok"] for r in replies)


frames = st.one_of(
    st.binary(max_size=300),
    st.builds(lambda body: HEADER.pack(MAGIC, PROTOCOL_VERSION, len(body)) + body, st.binary(max_size=200)),
    st.builds(lambda v: encode({**HELLO, "id": 1}, version=v), st.integers(0, 255)),
    st.builds(
        lambda d: encode({**HELLO, "id": 1}) + encode(d),
        st.dictionaries(st.sampled_from(["op", "id", "key", "pin", "name", "parties", "timeout", "keys", "epoch"]),
                        st.one_of(st.none(), st.booleans(), st.integers(-5, 5), st.text(max_size=5),
                                  st.sampled_from(["ensure", "barrier", "pin", "stats", "inspect"]),
                                  st.lists(st.text(max_size=3), max_size=3)), max_size=6),
    ),
)


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(payload=frames)
def test_any_bytes_close_only_their_connection(live_agent: Address, payload: bytes) -> None:
    _talk(live_agent, payload)
    _still_serves(live_agent)
