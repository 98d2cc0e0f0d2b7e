"""The watchdog: a wait on one shard or barrier that lasts too long gets a name and a voice.

Past ``warn_after`` it logs a warning; past ``fail_after`` it fails the wait with
:class:`WatchdogTimeout`. Both messages say what is waited on (the shard or barrier), its
stage (``queue``, ``download``, ``decompress``...) and who is missing, asked of the agent
at that moment. Timers are plain ``call_later`` handles: a wait that ends in time costs
two timer operations, not a task.

The message formatting is pure (:func:`describe_shard`, :func:`describe_barrier`).
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Awaitable, Callable, Coroutine
from dataclasses import dataclass
from typing import Any, TypeVar

from astream._storage.loop import within
from astream.errors import WatchdogTimeout

__all__ = ["WatchdogTimeout", "describe_barrier", "describe_shard", "watched"]

log = logging.getLogger("astream.coord")
T = TypeVar("T")
Describe = Callable[[], Awaitable[str]]


@dataclass(frozen=True)
class WatchPolicy:
    """When to warn and when to fail (seconds; ``fail_after=None`` never fails)."""

    warn_after: float
    fail_after: float | None


def describe_shard(key: str, info: dict[str, Any]) -> str:
    """A sentence about a shard wait from the agent's ``inspect`` answer."""
    waiters = info.get("waiters") or []
    return (
        f"shard {key!r} is in stage {info.get('stage', '?')!r} for {info.get('stage_seconds', 0):.1f}s; "
        f"{len(waiters)} process(es) wait on it ({', '.join(waiters) or 'none'}), {info.get('pins', 0)} pin(s)"
    )


def describe_barrier(name: str, info: dict[str, Any]) -> str:
    """A sentence about a barrier wait from the agent's ``inspect_barrier`` answer."""
    if not info.get("open"):
        return f"barrier {name!r} is not open at the agent (no other party arrived, or the agent restarted)"
    dead = info.get("dead") or []
    text = (
        f"barrier {name!r}: arrived {', '.join(info.get('arrived') or []) or 'none'}; "
        f"missing {', '.join(info.get('missing') or []) or 'none'}"
    )
    return text + (f"; dead: {', '.join(dead)}" if dead else "")


async def _ask(describe: Describe) -> str:
    try:
        return await within(2.0, describe())
    except asyncio.CancelledError:
        raise
    except Exception as exc:
        return f"the agent did not say ({type(exc).__name__}: {exc})"


async def watched(future: asyncio.Future[T], *, what: str, policy: WatchPolicy, describe: Describe) -> T:
    """Await ``future`` under the watchdog.

    Args:
        future: the wait (an answer from the agent).
        what: ``"shard 'x'"`` or ``"barrier 'y'"``, for the message.
        policy: the two limits.
        describe: asks the agent for the current stage / missing parties.

    Raises:
        WatchdogTimeout: still waiting after ``policy.fail_after`` seconds.
    """
    loop = asyncio.get_running_loop()
    helpers: set[asyncio.Task[None]] = set()

    async def warn() -> None:
        log.warning("astream: waited %.0fs on %s: %s", policy.warn_after, what, await _ask(describe))

    async def fail() -> None:
        detail = await _ask(describe)
        if not future.done():
            future.set_exception(WatchdogTimeout(
                f"gave up after {policy.fail_after:.0f}s waiting on {what}: {detail} "
                "(raise CoordConfig.watch_fail_after if this is expected)"
            ))

    def spawn(factory: Callable[[], Coroutine[Any, Any, None]]) -> None:
        task: asyncio.Task[None] = loop.create_task(factory())
        helpers.add(task)
        task.add_done_callback(helpers.discard)

    warn_timer = loop.call_later(policy.warn_after, spawn, warn)
    fail_timer = loop.call_later(policy.fail_after, spawn, fail) if policy.fail_after is not None else None
    try:
        return await future
    finally:
        warn_timer.cancel()
        if fail_timer is not None:
            fail_timer.cancel()
        for task in helpers:
            task.cancel()
