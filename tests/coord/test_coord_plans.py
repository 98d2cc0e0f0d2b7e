"""Readers' plans and positions through the agent to a plan-aware provider."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path
from typing import Any

from coordkit import GateProvider

from astream._coord.agent import Agent
from astream._coord.client import AsyncNodeClient
from astream._coord.config import CoordConfig
from astream._coord.provider import PlanAware
from astream._coord.rendezvous import derive_address, try_bind
from astream._coord.world import World

BOTH_LOOPS = True


class PlanGate(GateProvider):
    """A GateProvider that also records what the agent tells a plan-aware provider."""

    def __init__(self, root: str) -> None:
        super().__init__(root)
        self.plans: dict[str, list[Any]] = {}
        self.positions: dict[str, int] = {}
        self.epochs: list[int] = []

    def on_plan(self, reader: str, uses: list[int], starts: list[int], ends: list[int], window: int) -> None:
        self.plans[reader] = [uses, starts, ends, window]

    def append_plan(self, reader: str, uses: list[int], starts: list[int], ends: list[int]) -> None:
        self.plans[reader][0] += uses

    def on_progress(self, reader: str, position: int) -> None:
        self.positions[reader] = position

    def on_reader_gone(self, reader: str) -> None:
        self.plans.pop(reader, None)
        self.positions.pop(reader, None)

    def on_epoch(self, epoch: int) -> None:
        self.epochs.append(epoch)


async def _until(check: Any) -> None:
    for _ in range(200):
        if check():
            return
        await asyncio.sleep(0.01)
    raise AssertionError("never happened")


async def test_plans_reach_the_provider_and_go_with_their_connection(
    tmp_path: Path, run_id: str, config: CoordConfig
) -> None:
    provider = PlanGate(str(tmp_path))
    assert isinstance(provider, PlanAware)
    listener = try_bind(derive_address(str(tmp_path), run_id, abstract=config.abstract))
    assert listener is not None
    agent = Agent(provider, replace(config, agent_linger=30.0))
    ready = asyncio.Event()
    task = asyncio.create_task(agent.serve(listener, ready.set))
    await ready.wait()
    try:
        client = AsyncNodeClient(str(tmp_path), lambda: provider, run_id=run_id, world=World(), config=config)
        uses = list(range(20000))  # more than one message holds
        await client.report_plan("r", uses, uses, uses, window=8)
        client.report_progress("r", 12)
        assert await client.begin_epoch(1) == 0
        await _until(lambda: provider.positions)
        (name,) = provider.plans
        assert provider.plans[name][0] == uses
        assert provider.plans[name][3] == 8
        assert provider.positions == {name: 12}
        assert provider.epochs == [0]
        client.report_done("r")
        await _until(lambda: not provider.plans)
        await client.report_plan("r2", [1], [0], [0], window=1)
        await _until(lambda: provider.plans)
        # a connection that vanishes (a killed rank) takes its readers' plans with it
        assert client._link is not None
        client._link.close()
        await _until(lambda: not provider.plans)
        await client.aclose()
    finally:
        agent.stop()
        await task


async def test_a_new_agent_learns_the_open_readers_plans_and_positions(
    tmp_path: Path, run_id: str, config: CoordConfig
) -> None:
    listener = try_bind(derive_address(str(tmp_path), run_id, abstract=config.abstract))
    assert listener is not None
    first = PlanGate(str(tmp_path))
    agent = Agent(first, replace(config, agent_linger=30.0))
    ready = asyncio.Event()
    task = asyncio.create_task(agent.serve(listener, ready.set))
    await ready.wait()
    successor = PlanGate(str(tmp_path))
    async with AsyncNodeClient(str(tmp_path), lambda: successor, run_id=run_id, world=World(),
                               config=replace(config, agent_mode="thread", agent_linger=0.1)) as client:
        await client.report_plan("open", [5, 6], [0, 3], [2, 9], window=4)
        await client.report_plan("closed", [7], [0], [0], window=4)
        client.report_done("closed")
        client.report_progress("open", 3)
        await _until(lambda: list(first.positions.values()) == [3])
        agent.stop()
        await task
        await _until(lambda: successor.positions)
        assert list(successor.plans.values()) == [[[5, 6], [0, 3], [2, 9], 4]]
        assert list(successor.positions.values()) == [3]
