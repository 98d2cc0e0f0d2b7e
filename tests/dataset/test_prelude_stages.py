"""The start-up prelude's state machine, alone (``astream._dataset.start.stages``).

No loader, no node agent, no server: each test walks :class:`StartBook` through named
transitions and checks what the prelude's shell would do at each step (plan or not,
prefetch what, withdraw what, hand what over, hold or let a start join); the last ones run
the shell itself (``start/prelude.py``) with a fake client, planner and decodings: the warm
start, a loaded position, the hand-over, the holds, and batch 0 before the join.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import AsyncIterator, Awaitable, Callable
from concurrent.futures import Future

import numpy as np
import pytest

from astream._dataset.planner import ReaderShape
from astream._dataset.run import RunState
from astream._dataset.runtime import portal
from astream._dataset.start import prelude as prelude_module
from astream._dataset.start.stages import Prefetch, Stage, StartBook
from astream._dataset.state import EpochState
from astream.errors import StateError

EPOCH_START = ["0/0", "0/1"]  # the next epoch's first shards
RESUME = ["0/7"]  # a loaded position's first shard
AGAIN = ["0/3", "0/7"]  # another loaded position's


def test_idle_start_warming_plans_and_prefetches_once() -> None:
    book = StartBook()
    assert book.stage is Stage.IDLE
    assert not book.may_plan()
    assert book.start()  # IDLE -> WARMING
    assert book.stage is Stage.WARMING
    assert not book.start()  # (once: a second loader only reshapes)
    assert book.may_plan()
    assert book.prefetch(EPOCH_START, planned=True) == Prefetch([], EPOCH_START)
    assert book.prefetched == EPOCH_START


def test_move_resuming_withdraws_the_epoch_start_and_stops_planning() -> None:
    book = StartBook()
    book.start()
    book.prefetch(EPOCH_START, planned=True)
    book.move(RESUME)  # WARMING -> RESUMING
    assert book.stage is Stage.RESUMING
    assert not book.may_plan()  # a start still joining neither asks for the epoch nor plans it
    assert not book.may_run(planned=True)
    assert book.prefetch(EPOCH_START, planned=True) is None  # the start's own prefetch, overtaken
    assert book.prefetch(RESUME, planned=False) == Prefetch(sorted(EPOCH_START), RESUME)
    book.move(AGAIN)  # RESUMING -> RESUMING, elsewhere
    assert book.stage is Stage.RESUMING
    assert book.prefetch(AGAIN, planned=False) == Prefetch([], AGAIN)  # 0/7 is kept
    assert book.resume == AGAIN


def test_move_before_the_start_joined_skips_the_plan() -> None:
    book = StartBook()
    book.start()
    book.move(RESUME)  # the start's join was still under way
    assert book.prefetch(RESUME, planned=False) == Prefetch([], RESUME)
    assert book.prefetch(EPOCH_START, planned=True) is None


def test_hand_over_hands_a_loaded_position_once() -> None:
    book = StartBook()
    book.start()
    book.move(RESUME)
    assert book.hand_over() == RESUME  # RESUMING -> HANDED: asked for on the iteration's client
    assert book.stage is Stage.HANDED
    assert book.hand_over() is None  # (once)
    assert not book.may_plan()
    # The prelude's own prefetch of the same shards, queued behind: nothing asked twice.
    assert book.prefetch(RESUME, planned=False) == Prefetch([], [])


def test_hand_over_from_warming_hands_nothing() -> None:
    book = StartBook()
    book.start()
    book.prefetch(EPOCH_START, planned=True)
    assert book.hand_over() is None  # WARMING -> HANDED: the iteration asks for its own shards
    assert book.stage is Stage.HANDED
    assert book.prefetch(EPOCH_START, planned=True) is None


def test_move_after_the_hand_over_stays_handed_and_still_prefetches() -> None:
    # A state loaded between two iterations: the prelude's client prefetches it (the next
    # iteration's hand-over then asks for it on its own client, once).
    book = StartBook()
    book.start()
    assert book.hand_over() is None
    book.move(RESUME)  # HANDED stays HANDED
    assert book.stage is Stage.HANDED
    assert book.may_run(planned=False)
    assert book.prefetch(RESUME, planned=False) == Prefetch([], RESUME)
    assert book.hand_over() == RESUME


@pytest.mark.parametrize("at", [Stage.IDLE, Stage.WARMING, Stage.RESUMING, Stage.HANDED])
def test_stop_from_any_stage_is_final(at: Stage) -> None:
    book = StartBook()
    if at is not Stage.IDLE:
        book.start()
    if at is Stage.RESUMING:
        book.move(RESUME)
    if at is Stage.HANDED:
        book.hand_over()
    assert book.stage is at
    assert book.stop()  # -> STOPPED
    assert not book.stop()  # (idempotent)
    assert book.stage is Stage.STOPPED
    assert not book.start()
    book.move(AGAIN)
    assert book.stage is Stage.STOPPED
    assert book.resume != AGAIN
    assert book.hand_over() is None
    assert not book.may_run(planned=False)
    assert book.prefetch(AGAIN, planned=False) is None


def test_holds_count_and_only_the_first_and_last_move_the_gate() -> None:
    book = StartBook()
    assert book.hold()  # the first: a start not joined yet waits
    assert not book.hold()  # (a decoding's, beside the load's)
    assert not book.release()
    assert book.release()  # the last: it may join
    assert book.holds == 0
    with pytest.raises(RuntimeError, match="released more often"):
        book.release()


def test_holds_are_independent_of_the_stage() -> None:
    book = StartBook()
    book.start()
    book.hold()
    book.move(RESUME)
    assert book.stage is Stage.RESUMING
    assert book.holds == 1
    book.hand_over()
    assert book.release()


# -- the shell (start/prelude.py) over the book, with fakes: a loop thread, no node agent --------

class _Client:
    """What the prelude asks of its node client, logged."""

    def __init__(self, log: list[object]) -> None:
        self.log = log
        self.joined = False

    async def aconnect(self) -> None:
        if not self.joined:  # (idempotent, as the real one)
            self.joined = True
            self.log.append("join")

    async def get_epoch(self) -> int:
        self.log.append("epoch")
        return 3

    async def prefetch(self, keys: list[str], *, first: bool = False) -> None:
        self.log.append(("prefetch", tuple(keys), first))

    async def withdraw(self, keys: list[str]) -> None:
        self.log.append(("withdraw", tuple(keys)))

    async def aclose(self) -> None:
        self.log.append("leave")


class _Planner:
    """Each position's first shard is named after it; the reader's order is noted."""

    def __init__(self) -> None:
        self.ordered: list[tuple[int, int]] = []

    def first_keys(self, shape: object, epoch: int, sample_in_epoch: int = 0) -> list[str]:
        return [f"0/{epoch * 10 + sample_in_epoch}"]

    def reader_order(self, shape: object, epoch: int, sample_in_epoch: int) -> None:
        self.ordered.append((epoch, sample_in_epoch))


def _prelude(log: list[object]) -> tuple[prelude_module.Prelude, _Planner, RunState, list[list[str]]]:
    from types import SimpleNamespace

    planner = _Planner()
    run = SimpleNamespace(resume=None)
    read_ahead: list[list[str]] = []  # what the read-ahead was asked for (it decodes nothing here)

    def decode(keys: list[str]) -> list[object]:
        read_ahead.append(keys)
        return []

    prelude = prelude_module.Prelude(portal(), lambda: _Client(log), planner, run, None, None,  # type: ignore[arg-type]
                                     decode, per_sample=False)  # type: ignore[arg-type]
    return prelude, planner, run, read_ahead  # type: ignore[return-value]


def _settled(prelude: prelude_module.Prelude) -> None:
    """Wait for what the prelude queued on the loop thread."""
    async def idle() -> None:
        # (submitted after them: each has registered itself by now)
        tasks = [t for t in prelude._tasks if t is not asyncio.current_task()]
        if tasks:
            await asyncio.wait(tasks)

    portal().call(idle(), timeout=20)


def test_the_shell_warms_then_moves_then_hands_over_then_stops() -> None:
    log: list[object] = []
    prelude, planner, run, read_ahead = _prelude(log)
    prelude.start(ReaderShape(1, 4, False))  # IDLE -> WARMING: join, the node's epoch, its first shards
    _settled(prelude)
    assert log == ["join", "epoch", ("prefetch", ("0/30",), True)]
    assert prelude.book.stage is Stage.WARMING
    log.clear()
    prelude.moving()  # load_state_dict: RunState's watch
    run.resume = EpochState(1, 5, 1, 9176, 1)  # type: ignore[misc]
    prelude.moved(run.resume)  # WARMING -> RESUMING: the new position's shards instead
    _settled(prelude)
    assert prelude.book.stage is Stage.RESUMING
    assert log == [("withdraw", ("0/30",)), ("prefetch", ("0/15",), True)]
    assert read_ahead == [["0/15"]]  # the read-ahead trigger
    assert planner.ordered == [(1, 5)]  # nothing decoded: the reader's order now
    assert prelude.book.holds == 0
    log.clear()
    node = _Client(log)
    portal().call(prelude.hand_over(node))  # type: ignore[arg-type]  # -> HANDED: asked on the iteration's client
    assert log == [("prefetch", ("0/15",), True)]
    assert prelude.book.stage is Stage.HANDED
    log.clear()
    portal().call(prelude.astop())  # -> STOPPED: its client leaves
    assert log == ["leave"]
    assert prelude.book.stage is Stage.STOPPED


def test_the_shell_joins_only_once_the_holds_are_released() -> None:
    log: list[object] = []
    prelude, _, _, _ = _prelude(log)
    prelude.hold()
    prelude.start(ReaderShape(1, 4, False))
    time.sleep(0.2)  # (hold_s is 2 s: the start waits)
    assert log == []
    prelude.release()
    _settled(prelude)
    assert log[0] == "join"
    portal().call(prelude.astop())


def test_a_failed_load_moves_nothing_and_releases_its_hold() -> None:
    log: list[object] = []
    prelude, planner, _, read_ahead = _prelude(log)
    prelude.start(ReaderShape(1, 4, False))
    _settled(prelude)
    log.clear()
    prelude.moving()
    prelude.moved(None)  # RunState.load raised: the position did not move
    _settled(prelude)
    assert prelude.book.stage is Stage.WARMING
    assert prelude.book.holds == 0
    assert log == []
    assert read_ahead == []
    assert planner.ordered == []
    portal().call(prelude.astop())


def _resumed_prelude(decoded: Future[object] | None) -> prelude_module.Prelude:
    """A prelude whose loaded position (epoch 0, sample 20) reads batch 0 from shard 3 alone."""
    from types import SimpleNamespace

    planner = SimpleNamespace(first_ids=lambda shape, epoch, sample: [np.arange(sample, sample + shape.batch_size)])
    smap = SimpleNamespace(locate=lambda ids: (np.full(len(ids), 3), np.arange(len(ids))))
    shards = SimpleNamespace(offered=lambda shard: decoded if shard == 3 else None)
    run = SimpleNamespace(resume=EpochState(0, 20, 1, 9176, 1))
    return prelude_module.Prelude(portal(), lambda: _Client([]), planner, run, smap, shards,  # type: ignore[arg-type]
                                  lambda keys: [], per_sample=False)


def test_batch_0_is_read_before_the_join_which_must_begin_there() -> None:
    done: Future[object] = Future()
    done.set_result(("reader", 7))
    prelude = _resumed_prelude(done)
    events: list[str] = []

    async def batches() -> AsyncIterator[str]:
        for k in range(3):
            events.append(f"batch {k}")
            yield f"b{k}"

    def join_at(began: tuple[int, int]) -> Callable[[], Awaitable[tuple[int, int]]]:
        async def join() -> tuple[int, int]:
            events.append("join")
            return began
        return join

    async def run() -> None:
        first = await prelude.first_position(ReaderShape(1, 4, False), None)
        assert first is not None
        assert (first.epoch, first.offset) == (0, 20)
        assert prelude.book.holds == 1  # the node's start waits while batch 0 is read
        got = [b async for b in prelude.first_batch(first, batches(), join_at((0, 20)))]
        assert got == ["b0", "b1", "b2"]
        assert events == ["batch 0", "join", "batch 1", "batch 2"]
        assert prelude.book.holds == 0
        events.clear()
        first = await prelude.first_position(ReaderShape(1, 4, False), None)
        assert first is not None
        refused = prelude.first_batch(first, batches(), join_at((1, 0)))  # the node began epoch 1
        assert await refused.__anext__() == "b0"  # handed out before the join, then refused
        with pytest.raises(StateError, match="loaded different states"):
            await refused.__anext__()
        assert prelude.book.holds == 0
        # Where batch 0 does not come before the join: workers, a collate_fn.
        assert await prelude.first_position(ReaderShape(2, 4, False), None) is None
        assert await prelude.first_position(ReaderShape(1, 4, False), list) is None
        assert prelude.book.holds == 0

    asyncio.run(run())


def test_a_failed_or_missing_decoding_leaves_batch_0_to_the_iteration() -> None:
    failed: Future[object] = Future()
    failed.set_exception(OSError("read failed"))

    async def run(prelude: prelude_module.Prelude) -> None:
        assert await prelude.first_position(ReaderShape(1, 4, False), None) is None
        assert prelude.book.holds == 0

    asyncio.run(run(_resumed_prelude(failed)))
    asyncio.run(run(_resumed_prelude(None)))
