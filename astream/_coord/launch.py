"""Starting the node agent, in its own process (default) or on a thread of the leader.

The leader has already bound the listening socket (:func:`~.rendezvous.try_bind`); the
agent inherits it. In process mode the agent is a fresh interpreter (``subprocess``,
fork+exec: nothing is forked after a loop or thread exists) in its own session, so it
outlives a leader that is killed and is never slowed by the leader's GIL. The leader
hands it the provider factory and config by pickle over stdin and waits for one line on
its stdout: ``ready`` or the error that stopped it.

The agent process runs ``python -m astream._coord FD`` (:func:`agent_main`).
"""

from __future__ import annotations

import asyncio
import atexit
import contextlib
import logging
import os
import pickle
import signal
import socket
import subprocess
import sys
import threading
from collections.abc import Callable

from astream._coord.agent import Agent
from astream._coord.config import CoordConfig
from astream._coord.provider import ProviderFactory
from astream.errors import CoordinationError

__all__ = ["agent_main", "new_event_loop", "refused_at_exit", "run_agent", "start_agent"]

log = logging.getLogger("astream.coord")


def new_event_loop() -> asyncio.AbstractEventLoop:
    """A uvloop loop when uvloop is installed, else asyncio's default."""
    try:
        import uvloop
    except ImportError:  # pragma: no cover - uvloop is a dependency on POSIX
        return asyncio.new_event_loop()
    return uvloop.new_event_loop()


def run_agent(listener: socket.socket, factory: ProviderFactory, config: CoordConfig,
              on_ready: Callable[[], None], *, signals: bool = False,
              on_agent: Callable[[asyncio.AbstractEventLoop, Agent], None] | None = None, view: str = "") -> None:
    """Run an agent on ``listener`` until it goes idle; blocks (a process or a thread).

    ``on_agent`` is told the loop and the agent once it exists (to stop it from elsewhere);
    ``view``: the dataset it serves (see :class:`~astream._coord.agent.Agent`).

    Raises:
        Exception: whatever stopped the agent from starting (bad factory, rebuild failed).
    """
    loop = new_event_loop()
    try:
        loop.run_until_complete(_serve(listener, factory, config, on_ready, signals, on_agent, view))
    finally:
        loop.close()


async def _serve(listener: socket.socket, factory: ProviderFactory, config: CoordConfig,
                 on_ready: Callable[[], None], signals: bool,
                 on_agent: Callable[[asyncio.AbstractEventLoop, Agent], None] | None = None, view: str = "") -> None:
    agent = Agent(factory(), config, view)
    if on_agent is not None:
        on_agent(asyncio.get_running_loop(), agent)
    if signals:
        loop = asyncio.get_running_loop()
        loop.add_signal_handler(signal.SIGTERM, agent.stop)
        loop.add_signal_handler(signal.SIGINT, agent.stop)
    await agent.serve(listener, on_ready)


def start_agent(listener: socket.socket, factory: ProviderFactory, config: CoordConfig, view: str = "") -> int:
    """Start an agent serving ``listener``; return its pid once it accepts clients. Blocks.

    The caller's copy of ``listener`` is closed in process mode (the agent owns it now).

    Raises:
        CoordinationError: the agent did not start within ``config.connect_timeout``.
    """
    if config.agent_mode == "thread":
        return _start_thread(listener, factory, config, view)
    try:
        return _start_process(listener, factory, config, view)
    finally:
        listener.close()


# Agents on threads of this process, each (thread, [(loop, agent)] once it runs).
_thread_agents: list[tuple[threading.Thread, list[tuple[asyncio.AbstractEventLoop, Agent]]]] = []
_EXIT_JOIN = 5.0  # seconds an agent thread may take to shut down at exit
_hooked = False


def _stop_thread_agents() -> None:
    """Stop this process's agent threads as the interpreter exits, before it finalizes: one
    lingering (``agent_linger``) would fire its idle timer into a finalized interpreter
    from its uvloop thread and crash the process (seen after a torch training loop, whose
    exit is slow, about one run in ten)."""
    agents, _thread_agents[:] = list(_thread_agents), []
    for thread, running in agents:
        if thread.is_alive() and running:
            loop, agent = running[0]
            with contextlib.suppress(RuntimeError):  # (its loop closed meanwhile)
                loop.call_soon_threadsafe(agent.stop)
    for thread, _ in agents:
        thread.join(_EXIT_JOIN)


def _track_thread_agent(thread: threading.Thread, running: list[tuple[asyncio.AbstractEventLoop, Agent]]) -> None:
    global _hooked
    if not _hooked:
        # atexit's hooks run once threading's have (astream's loop closed, its clients gone:
        # none joins again to start another agent) and before the interpreter finalizes.
        _hooked = True
        atexit.register(_stop_thread_agents)
    _thread_agents[:] = [t for t in _thread_agents if t[0].is_alive()]
    _thread_agents.append((thread, running))


def _start_thread(listener: socket.socket, factory: ProviderFactory, config: CoordConfig, view: str) -> int:
    ready = threading.Event()
    failure: list[BaseException] = []
    running: list[tuple[asyncio.AbstractEventLoop, Agent]] = []

    def target() -> None:
        try:
            run_agent(listener, factory, config, ready.set, on_agent=lambda loop, agent: running.append((loop, agent)),
                      view=view)
        except BaseException as exc:
            failure.append(exc)
            # A program that ended while its agent started (it took a batch and left): the
            # interpreter's shutdown refused the agent's threads; nobody waits for it.
            log.log(logging.DEBUG if refused_at_exit(exc) else logging.ERROR, "astream agent thread failed",
                    exc_info=True)
        finally:
            listener.close()
            ready.set()

    thread = threading.Thread(target=target, name="astream-agent", daemon=True)
    thread.start()
    _track_thread_agent(thread, running)
    if not ready.wait(config.connect_timeout) or failure:
        raise CoordinationError(f"the node agent thread did not start: {failure[0] if failure else 'timed out'}")
    return os.getpid()


def refused_at_exit(exc: BaseException) -> bool:
    """Whether ``exc`` is a thread pool's refusal of new work because it was shut down, as
    the interpreter does when it exits (``concurrent.futures`` words it so since Python
    3.9, and so does astream's own executor)."""
    return isinstance(exc, RuntimeError) and "cannot schedule new futures after" in str(exc)


def _start_process(listener: socket.socket, factory: ProviderFactory, config: CoordConfig, view: str) -> int:
    try:
        payload = pickle.dumps((factory, config, view))
    except Exception as exc:
        raise CoordinationError(
            f"the provider factory {factory!r} must be picklable to start the node agent: {exc}"
        ) from exc
    env = dict(os.environ)
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env["PYTHONPATH"] = os.pathsep.join(p for p in (root, env.get("PYTHONPATH")) if p)
    fd = listener.fileno()
    proc = subprocess.Popen(
        [sys.executable, "-m", "astream._coord", str(fd)],
        pass_fds=(fd,), stdin=subprocess.PIPE, stdout=subprocess.PIPE, env=env, start_new_session=True,
    )
    threading.Thread(target=proc.wait, name=f"astream-agent-reaper-{proc.pid}", daemon=True).start()
    assert proc.stdin is not None
    assert proc.stdout is not None
    line: list[bytes] = []
    reader = threading.Thread(target=lambda: line.append(proc.stdout.readline()), daemon=True)  # type: ignore[union-attr]
    try:
        with contextlib.suppress(BrokenPipeError):
            proc.stdin.write(payload)
            proc.stdin.close()
        reader.start()
        reader.join(config.connect_timeout)
    finally:
        with contextlib.suppress(OSError):
            proc.stdin.close()
    answer = line[0].decode(errors="replace").strip() if line else ""
    if not line:
        proc.kill()
        reader.join(5.0)  # EOF now; the pipe can be closed under no reader
    proc.stdout.close()
    if answer != "ready":
        raise CoordinationError(f"the node agent (pid {proc.pid}) did not start: {answer or 'no answer in time'}")
    return proc.pid


def agent_main(argv: list[str]) -> int:
    """Body of the agent process: adopt the listener ``argv[1]``, read the pickle, serve."""
    listener = socket.socket(fileno=int(argv[1]))
    out = os.fdopen(os.dup(1), "wb")
    devnull = os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 1)  # later prints must not hit a pipe the leader closed
    os.close(devnull)

    def ready() -> None:
        with contextlib.suppress(OSError):
            out.write(b"ready\n")
            out.close()

    try:
        factory, config, view = pickle.loads(sys.stdin.buffer.read())
        logging.basicConfig(level=logging.WARNING, format="%(asctime)s astream-agent[%(process)d] %(message)s")
        run_agent(listener, factory, config, ready, signals=True, view=view)
    except BaseException as exc:
        with contextlib.suppress(OSError):
            out.write(f"error: {type(exc).__name__}: {exc}\n".encode())
            out.close()
        raise
    return 0

