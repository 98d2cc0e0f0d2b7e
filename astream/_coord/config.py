"""Timeouts and limits of node coordination, as one frozen, validated value."""

from __future__ import annotations

import math
import sys
from dataclasses import dataclass
from typing import Literal

from astream._checks import check_int
from astream.errors import ConfigError

__all__ = ["CoordConfig"]

AgentMode = Literal["process", "thread"]
Namespace = Literal["auto", "abstract", "filesystem"]


@dataclass(frozen=True)
class CoordConfig:
    """How long node coordination waits, and where the agent runs.

    Attributes:
        connect_timeout: seconds a process may spend finding (or electing and starting)
            the node agent, and re-electing one after the agent died. Past it, the
            operation fails with ``CoordinationError``.
        barrier_timeout: default seconds a barrier waits for its parties.
        watch_warn_after: a wait on one shard or barrier longer than this is logged,
            naming the shard/barrier, its stage and the missing parties.
        watch_fail_after: past this, the wait raises ``CoordinationError`` with the same
            message; ``None`` never raises.
        agent_linger: seconds the agent keeps running after its last client left, so a
            process that reconnects right away finds it.
        agent_mode: ``"process"`` (default) runs the agent in its own interpreter, so a
            leader busy in Python code (the GIL) never slows the node; ``"thread"`` runs it
            on an event-loop thread of the leader (benchmarks and light tests).
        namespace: ``"abstract"`` (Linux abstract socket, nothing on disk),
            ``"filesystem"`` (a 0600 socket in a 0700 runtime directory), or ``"auto"``.
        max_frame: largest protocol frame in bytes; a bigger one closes the connection.
    """

    connect_timeout: float = 30.0
    barrier_timeout: float = 300.0
    watch_warn_after: float = 60.0
    watch_fail_after: float | None = 900.0
    agent_linger: float = 2.0
    agent_mode: AgentMode = "process"
    namespace: Namespace = "auto"
    max_frame: int = 1 << 20

    def __post_init__(self) -> None:
        for name in ("connect_timeout", "barrier_timeout", "watch_warn_after", "agent_linger"):
            _positive(name, getattr(self, name), zero_ok=name == "agent_linger")
        if self.watch_fail_after is not None:
            _positive("watch_fail_after", self.watch_fail_after)
            if self.watch_fail_after < self.watch_warn_after:
                raise ConfigError(
                    f"watch_fail_after ({self.watch_fail_after}) must be >= watch_warn_after ({self.watch_warn_after})"
                )
        if self.agent_mode not in ("process", "thread"):
            raise ConfigError(f"agent_mode must be 'process' or 'thread', got {self.agent_mode!r}")
        if self.namespace not in ("auto", "abstract", "filesystem"):
            raise ConfigError(f"namespace must be 'auto', 'abstract' or 'filesystem', got {self.namespace!r}")
        if self.namespace == "abstract" and not sys.platform.startswith("linux"):
            raise ConfigError("namespace='abstract' needs Linux; use 'filesystem' or 'auto'")
        check_int("max_frame", self.max_frame, 1024)

    @property
    def abstract(self) -> bool:
        """Whether the rendezvous uses the Linux abstract socket namespace."""
        if self.namespace == "auto":
            return sys.platform.startswith("linux")
        return self.namespace == "abstract"


def _positive(name: str, value: object, *, zero_ok: bool = False) -> None:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
        raise ConfigError(f"CoordConfig.{name} must be a finite number of seconds, got {value!r}")
    if value < 0 or (value == 0 and not zero_ok):
        raise ConfigError(f"CoordConfig.{name} must be > 0, got {value!r}")
