"""One agent per dataset (issue 32, finding 1): the view is part of the address and of the hello."""

from __future__ import annotations

import asyncio
from pathlib import Path

import pytest

from astream._coord.agent import Agent
from astream._coord.client import AsyncNodeClient
from astream._coord.config import CoordConfig
from astream._coord.rendezvous import derive_address, try_bind
from astream._coord.world import World
from astream.errors import CoordinationError
from tests.coord.simple_provider import SimpleProviderFactory


def test_the_view_is_part_of_the_address(tmp_path: Path) -> None:
    train = derive_address(str(tmp_path), "run", abstract=True, view="train-digest")
    assert train == derive_address(str(tmp_path), "run", abstract=True, view="train-digest")
    assert train != derive_address(str(tmp_path), "run", abstract=True, view="val-digest")
    assert train != derive_address(str(tmp_path), "run", abstract=True)


async def test_an_agent_refuses_a_client_of_another_dataset(tmp_path: Path, run_id: str, config: CoordConfig) -> None:
    (tmp_path / "remote").mkdir()
    address = derive_address(str(tmp_path), run_id, abstract=config.abstract, view="train")
    listener = try_bind(address)
    assert listener is not None
    agent = Agent(SimpleProviderFactory(str(tmp_path / "remote"), str(tmp_path / "local"))(), config, view="train")
    ready = asyncio.Event()
    task = asyncio.create_task(agent.serve(listener, ready.set))
    await ready.wait()
    try:
        ours = AsyncNodeClient(str(tmp_path), SimpleProviderFactory("x", "y"), run_id=run_id, world=World(),
                               config=config, view="train")
        assert ours.address == address
        async with ours:
            await ours.get_epoch()
        stray = AsyncNodeClient(str(tmp_path), SimpleProviderFactory("x", "y"), run_id=run_id, world=World(),
                                member="val.main", config=config, view="val")
        stray.address = address  # as if the address had not told the datasets apart
        with pytest.raises(CoordinationError, match="reads dataset val but this node agent serves dataset train"):
            await stray.aconnect()
        await stray.aclose()
    finally:
        agent.stop()
        await task
