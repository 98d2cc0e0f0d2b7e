"""The cloud backends end to end: credentials from the variables users set, and datasets
written with MDSWriter(out="gs://..." / "azure://...") streamed back by two ranks, exactly,
through the fault-injecting proxy."""

from __future__ import annotations

import asyncio
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from astream import MDSWriter, StreamingDataset
from astream._coord.config import CoordConfig
from astream._coord.world import World
from astream._storage.registry import StoragePool, configure, storage_class
from astream.errors import AccessDeniedError
from astream.testing import Fault, LoopbackServer, moto_s3

from .conftest import FAST
from .emulators import AZURITE_ACCOUNT, AZURITE_KEY, azurite, azurite_connection_string, gcs_emulator
from .proxy import FaultProxy

THREAD_AGENT = CoordConfig(agent_mode="thread", connect_timeout=20, barrier_timeout=30)
N = 300


def _write(out: str, storage_options: dict[str, Any] | None = None) -> None:
    with MDSWriter(out=out, columns={"id": "int64", "x": "ndarray:uint8:200"}, compression="zstd",
                   size_limit="8kb", storage_options=storage_options, options=FAST) as writer:
        for i in range(N):
            writer.write({"id": i, "x": np.full(200, i % 251, np.uint8)})


async def _two_ranks(remote: str, cache: Path, storage_options: dict[str, Any]) -> None:
    datasets = []
    for rank in range(2):
        world = World(rank=rank, world_size=2, local_rank=0, ranks_per_node=1)
        datasets.append(StreamingDataset(
            remote=remote, local=str(cache / f"node{rank}"), storage_options=storage_options, world=world,
            run_id=f"cloud-node{rank}", coord=THREAD_AGENT, shuffle=True, shuffle_seed=3, batch_size=4,
            download_timeout=5, download_retry=3,
        ))

    async def one(ds: StreamingDataset) -> list[int]:
        return [int(s["id"]) async for s in ds]

    try:
        got = await asyncio.gather(*(one(ds) for ds in datasets))
    finally:
        for ds in datasets:
            await ds.aclose()
    for rank, (ds, ids) in enumerate(zip(datasets, got, strict=True)):
        plan = ds.plan(epoch=0, sample_in_epoch=0, workers_per_rank=1)
        assert ids == plan.rank_order(rank, 0).tolist()
    assert sorted(got[0] + got[1]) == list(range(N))
    assert _leftovers(cache) == []


def _leftovers(cache: Path) -> list[Path]:
    """Temporaries left in the caches (a partial shard must never stay)."""
    return [p for p in cache.rglob("*") if p.name.endswith(".tmp") or ".part" in p.name]


def _faults(proxy: FaultProxy) -> None:
    proxy.add(Fault("status", match="*shard.00001.mds*", status=503, retry_after="0", times=2))
    proxy.add(Fault("status", match="*shard.00002.mds*", status=429, retry_after="0", times=1))
    proxy.add(Fault("reset", match="*shard.00003.mds*", after=1000, times=1))
    proxy.add(Fault("truncate", match="*shard.00004.mds*", after=1000, times=1))
    proxy.add(Fault("status", match="*shard.00005.mds*", status=500, times=1))


@pytest.fixture(scope="module")
def gcs() -> Iterator[str]:
    with gcs_emulator("astream-test") as url:
        yield url


@pytest.fixture(scope="module")
def azure_url() -> Iterator[str]:
    with azurite("astream-test") as url:
        yield url


async def test_gcs_dataset_written_then_read_by_two_ranks_through_faults(gcs: str, tmp_path: Path) -> None:
    with FaultProxy(gcs) as proxy:
        options = {"endpoint_url": proxy.url, "anonymous": True}
        await asyncio.to_thread(_write, "gs://astream-test/e2e", options)
        uploads = [p for m, p in proxy.log if m in ("PUT", "POST")]
        assert "index.json" in uploads[-1]
        proxy.clear()
        _faults(proxy)
        await _two_ranks("gs://astream-test/e2e", tmp_path, options)
        assert proxy.count("*shard.00001.mds*", "GET") >= 3  # throttled twice, then served


async def test_azure_dataset_written_then_read_by_two_ranks_through_faults(azure_url: str, tmp_path: Path) -> None:
    with FaultProxy(azure_url) as proxy:
        options = {"connection_string": azurite_connection_string(proxy.url)}
        await asyncio.to_thread(_write, "azure://astream-test/e2e", options)
        proxy.clear()
        _faults(proxy)
        await _two_ranks("azure://astream-test/e2e", tmp_path, options)


async def _roundtrip(url: str, options: Any, tmp_path: Path) -> bytes:
    (tmp_path / "src").write_bytes(b"payload-" * 1000)
    async with StoragePool(options) as pool:
        storage = pool.get(url)
        await storage.put(str(tmp_path / "src"), url)
        return await storage.read_bytes(url)


async def test_gcs_emulator_host_variable(gcs: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    for host in (gcs, gcs.removeprefix("http://")):  # with and without the scheme, as users set it
        monkeypatch.setenv("STORAGE_EMULATOR_HOST", host)
        assert await _roundtrip("gs://astream-test/env/a.bin", FAST, tmp_path) == b"payload-" * 1000


async def test_gcs_hmac_keys_go_through_the_s3_compatible_api(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("aiobotocore")
    from astream._storage.gcs import GcsHmacStorage

    with moto_s3("hmac-bucket"):
        endpoint = os.environ["S3_ENDPOINT_URL"]
        monkeypatch.setenv("GCS_KEY", "testing")
        monkeypatch.setenv("GCS_SECRET", "testing")
        monkeypatch.delenv("GOOGLE_APPLICATION_CREDENTIALS", raising=False)
        monkeypatch.delenv("STORAGE_EMULATOR_HOST", raising=False)
        options = configure("gs://hmac-bucket", {"endpoint_url": endpoint}, FAST)
        assert isinstance(storage_class("gs://hmac-bucket/x")(options, None), GcsHmacStorage)
        assert await _roundtrip("gs://hmac-bucket/k/a.bin", options, tmp_path) == b"payload-" * 1000
        explicit = configure("gs://hmac-bucket", {"endpoint_url": endpoint, "hmac_key": "testing",
                                                  "hmac_secret": "testing"}, FAST)
        monkeypatch.delenv("GCS_KEY")
        assert await _roundtrip("gs://hmac-bucket/k/b.bin", explicit, tmp_path) == b"payload-" * 1000


async def test_azure_mosaicml_variables_and_a_refused_key(
    azure_url: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.delenv("AZURE_STORAGE_CONNECTION_STRING", raising=False)
    monkeypatch.setenv("AZURE_ACCOUNT_NAME", AZURITE_ACCOUNT)
    monkeypatch.setenv("AZURE_ACCOUNT_ACCESS_KEY", AZURITE_KEY)
    endpoint = {"endpoint_url": f"{azure_url}/{AZURITE_ACCOUNT}"}
    options = configure("azure://astream-test", endpoint, FAST)
    assert await _roundtrip("azure://astream-test/env/a.bin", options, tmp_path) == b"payload-" * 1000
    monkeypatch.setenv("AZURE_ACCOUNT_ACCESS_KEY", "d3Jvbmcta2V5LXdyb25nLWtleS13cm9uZy1rZXktd3Jvbmcta2V5")
    async with StoragePool(options) as pool:
        with pytest.raises(AccessDeniedError, match="AZURE_ACCOUNT_ACCESS_KEY"):
            await pool.get("azure://astream-test/env/a.bin").read_bytes("azure://astream-test/env/a.bin")


@pytest.fixture
def s3_no_credentials(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    pytest.importorskip("aiobotocore")
    with moto_s3("public-bucket") as client:
        client.put_object(Bucket="public-bucket", Key="k/a.bin", Body=b"open data", ACL="public-read")
        for name in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN", "AWS_PROFILE"):
            monkeypatch.delenv(name, raising=False)
        monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "none"))
        monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "none"))
        monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")  # never ask 169.254.169.254
        yield "s3://public-bucket/k/a.bin"


async def test_s3_public_bucket_unsigned_by_default_and_on_request(s3_no_credentials: str) -> None:
    from astream._storage.s3 import S3Storage

    for options in ({}, {"anonymous": True}):
        async with S3Storage(configure(s3_no_credentials, options, FAST)) as storage:
            _, _, unsigned = await storage._client_args()
            assert unsigned
            assert await storage.read_bytes(s3_no_credentials) == b"open data"


async def test_s3_profile_and_requester_pays(
    s3_no_credentials: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from astream._storage.s3 import S3Storage

    (tmp_path / "creds").write_text("[team]\naws_access_key_id = testing\naws_secret_access_key = testing\n")
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "creds"))
    monkeypatch.setenv("AWS_PROFILE", "team")
    monkeypatch.setenv("MOSAICML_STREAMING_AWS_REQUESTER_PAYS", "other,public-bucket")
    async with S3Storage(configure(s3_no_credentials, {}, FAST)) as storage:
        _, _, unsigned = await storage._client_args()
        assert not unsigned
        assert storage._extra("public-bucket") == {"RequestPayer": "requester"}
        assert storage._extra("free-bucket") == {}
        assert await storage.read_bytes(s3_no_credentials) == b"open data"
    async with S3Storage(configure(s3_no_credentials, {"requester_pays": True}, FAST)) as storage:
        assert storage._extra("free-bucket") == {"RequestPayer": "requester"}


def test_hf_dataset_through_the_resolve_endpoint(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    repo = tmp_path / "hub" / "datasets" / "org" / "repo" / "resolve"
    _write(str(repo / "v1.0" / "ds"))
    with LoopbackServer(str(tmp_path / "hub"), require_headers={"Authorization": "Bearer hf_secret"}) as srv:
        monkeypatch.setenv("HF_ENDPOINT", srv.url)
        monkeypatch.setenv("HF_TOKEN", "hf_secret")
        ds = StreamingDataset(remote="hf://datasets/org/repo@v1.0/ds", local=str(tmp_path / "c1"), coord=THREAD_AGENT)
        assert sorted(int(s["id"]) for s in ds) == list(range(N))
        monkeypatch.setenv("HF_TOKEN", "hf_wrong")
        with pytest.raises(AccessDeniedError, match="HF_TOKEN"):
            StreamingDataset(remote="hf://datasets/org/repo@v1.0/ds", local=str(tmp_path / "c2"), coord=THREAD_AGENT)


async def test_azure_sas_token_and_a_public_container(azure_url: str, tmp_path: Path) -> None:
    import datetime
    import uuid

    from azure.storage.blob import BlobServiceClient, generate_container_sas

    public_name = f"public-{uuid.uuid4().hex[:8]}"
    service = BlobServiceClient.from_connection_string(azurite_connection_string(azure_url))
    service.create_container(public_name, public_access="blob")
    service.get_blob_client(public_name, "k/a.bin").upload_blob(b"open data")
    sas = generate_container_sas(AZURITE_ACCOUNT, "astream-test", account_key=AZURITE_KEY, permission="rwc",
                                 expiry=datetime.datetime.now(datetime.timezone.utc) + datetime.timedelta(hours=1))
    endpoint = f"{azure_url}/{AZURITE_ACCOUNT}"
    with_sas = configure("azure://astream-test", {"account_name": AZURITE_ACCOUNT, "sas_token": sas,
                                                  "endpoint_url": endpoint}, FAST)
    assert await _roundtrip("azure://astream-test/sas/a.bin", with_sas, tmp_path) == b"payload-" * 1000
    blob = f"azure://{public_name}/k/a.bin"
    public = configure(blob, {"anonymous": True, "endpoint_url": endpoint}, FAST)
    async with StoragePool(public) as pool:
        storage = pool.get(blob)
        assert await storage.read_bytes(blob) == b"open data"
        assert (await storage.stat(blob)).size == 9
