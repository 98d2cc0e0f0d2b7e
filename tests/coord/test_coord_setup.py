"""Configuration, addresses and starting the agent: the errors a user meets first."""

from __future__ import annotations

import asyncio
from dataclasses import replace
from pathlib import Path

import pytest

from astream._coord.client import AsyncNodeClient
from astream._coord.config import CoordConfig
from astream._coord.rendezvous import default_run_id, derive_address
from astream._coord.world import World
from astream.errors import ConfigError, CoordinationError
from tests.coord.simple_provider import SimpleProviderFactory


@pytest.mark.parametrize(
    ("field", "value", "match"),
    [
        ("connect_timeout", 0, "connect_timeout"),
        ("barrier_timeout", float("inf"), "barrier_timeout"),
        ("watch_warn_after", -1, "watch_warn_after"),
        ("watch_fail_after", 1.0, "watch_fail_after"),
        ("agent_mode", "fork", "agent_mode"),
        ("namespace", "shm", "namespace"),
        ("max_frame", 10, "max_frame"),
        ("agent_linger", True, "agent_linger"),
    ],
)
def test_config_is_validated(field: str, value: object, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        replace(CoordConfig(watch_warn_after=5.0), **{field: value})


def test_address_is_short_private_and_distinct(tmp_path: Path) -> None:
    deep = tmp_path / ("x" * 150)
    a = derive_address(str(deep), "run-1", abstract=True)
    assert a.name.startswith("\0astream-")
    assert len(a.name) < 108
    assert a == derive_address(str(deep) + "/.", "run-1", abstract=True)  # same realpath, same node
    assert a != derive_address(str(deep), "run-2", abstract=True)  # another job on this machine
    assert a != derive_address(str(deep), "run-1", abstract=True, uid=12345)  # another user
    with pytest.raises(ConfigError):
        derive_address("", "run", abstract=True)


def test_default_run_id(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in ("ASTREAM_RUN_ID", "TORCHELASTIC_RUN_ID", "SLURM_JOB_ID", "JAX_COORDINATOR_ADDRESS",
                 "MASTER_ADDR", "MASTER_PORT", "SLURM_STEP_ID", "PMIX_NAMESPACE", "OMPI_MCA_ess_base_jobid",
                 "TF_CONFIG"):
        monkeypatch.delenv(name, raising=False)
    assert default_run_id() == ""
    monkeypatch.setenv("MASTER_ADDR", "10.0.0.1")
    monkeypatch.setenv("MASTER_PORT", "29500")
    assert default_run_id() == "10.0.0.1:29500"
    monkeypatch.setenv("SLURM_JOB_ID", "77")
    monkeypatch.setenv("SLURM_STEP_ID", "2")
    assert default_run_id() == "SLURM_JOB_ID=77.2"
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "abc")
    assert default_run_id() == "abc"


async def test_unpicklable_factory_is_a_clear_error(tmp_path: Path, run_id: str, config: CoordConfig) -> None:
    client = AsyncNodeClient(str(tmp_path), lambda: None, run_id=run_id, world=World(), config=config)  # type: ignore[arg-type, return-value]
    with pytest.raises(CoordinationError, match="must be picklable"):
        await client.aconnect()
    await client.aclose()


async def test_agent_that_cannot_start_says_why(tmp_path: Path, run_id: str, config: CoordConfig) -> None:
    factory = SimpleProviderFactory(str(tmp_path), str(tmp_path / "cache"), max_concurrency=0)
    client = AsyncNodeClient(str(tmp_path / "cache"), factory, run_id=run_id, world=World(), config=config)
    with pytest.raises(CoordinationError, match=r"did not start: error: ConfigError: max_concurrency"):
        await client.aconnect()
    await client.aclose()


async def test_agent_thread_that_cannot_start_says_why(tmp_path: Path, run_id: str, config: CoordConfig) -> None:
    """The electing client says hello while its agent starts: a start that fails still
    raises its own reason, not a lost connection, and the next client elects again."""
    factory = SimpleProviderFactory(str(tmp_path), str(tmp_path / "cache"), max_concurrency=0)
    cfg = replace(config, agent_mode="thread")
    for _ in range(2):
        client = AsyncNodeClient(str(tmp_path / "cache"), factory, run_id=run_id, world=World(), config=cfg)
        with pytest.raises(CoordinationError, match=r"thread did not start: .*max_concurrency"):
            await client.aconnect()
        await client.aclose()


async def test_aclose_survives_cancellation(tmp_path: Path, run_id: str, config: CoordConfig) -> None:
    folder = tmp_path / "remote"
    folder.mkdir()
    factory = SimpleProviderFactory(str(folder), str(tmp_path / "cache"))
    cfg = replace(config, agent_mode="thread", agent_linger=0.1)
    client = AsyncNodeClient(str(tmp_path / "cache"), factory, run_id=run_id, world=World(), config=cfg)
    await client.aconnect()
    closing = asyncio.ensure_future(client.aclose())
    closing.cancel()
    with pytest.raises(asyncio.CancelledError):
        await closing
    await client.aclose()  # idempotent, and the link is closed already
    assert client._link is None
