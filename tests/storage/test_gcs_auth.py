"""Google credentials of ``gs://``: the token is fetched under astream's retry policy.

A loopback aiohttp server plays Google's OAuth endpoint (``token_uri`` of a service-account
file) and a GCE metadata server (``GCE_METADATA_HOST``); the fault proxy in front of it
answers 503/429, resets, or refuses, and the GCS emulator behind another proxy checks
that every request carries the token.
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import pytest
from aiohttp import web

from astream._storage.loop import LoopThread
from astream._storage.registry import StoragePool, configure
from astream.errors import AccessDeniedError, DownloadError
from astream.testing import HOST, Fault, free_port

from .conftest import FAST
from .emulators import gcs_emulator
from .proxy import FaultProxy

TOKEN = "ya29.astream-test"
PAYLOAD = b"payload-" * 1000


@dataclass
class TokenServer:
    """What the fake Google endpoints were asked."""

    url: str
    grants: list[str] = field(default_factory=list)  # grant_type of each OAuth POST
    metadata: list[str | None] = field(default_factory=list)  # Metadata-Flavor of each metadata GET


@pytest.fixture(scope="module")
def token_server() -> Iterator[TokenServer]:
    state = TokenServer(url="")

    async def oauth(request: web.Request) -> web.Response:
        state.grants.append(str((await request.post()).get("grant_type", "")))
        return web.json_response({"access_token": TOKEN, "expires_in": 3600, "token_type": "Bearer"})

    async def metadata(request: web.Request) -> web.Response:
        flavor = request.headers.get("Metadata-Flavor")
        state.metadata.append(flavor)
        if flavor != "Google":  # what the real server does without the header
            return web.Response(status=403, text="Missing Metadata-Flavor:Google header")
        return web.json_response({"access_token": TOKEN, "expires_in": 3600, "token_type": "Bearer"})

    port = free_port()

    async def start() -> web.AppRunner:
        app = web.Application()
        app.router.add_post("/token", oauth)
        app.router.add_get("/computeMetadata/v1/instance/service-accounts/default/token", metadata)
        runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await runner.setup()
        await web.TCPSite(runner, HOST, port).start()
        return runner

    thread = LoopThread("token-server")
    runner = thread.call(start())
    state.url = f"http://{HOST}:{port}"
    try:
        yield state
    finally:
        thread.call(runner.cleanup())
        thread.close()


@pytest.fixture(scope="module")
def gcs() -> Iterator[str]:
    with gcs_emulator("astream-test") as url:
        yield url


@pytest.fixture
def no_google_env(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """No credentials anywhere but what a test sets (no gcloud user file either)."""
    for name in ("GOOGLE_APPLICATION_CREDENTIALS", "STORAGE_EMULATOR_HOST", "GCE_METADATA_HOST",
                 "GCE_METADATA_ROOT", "GCS_KEY", "GCS_SECRET"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("CLOUDSDK_CONFIG", str(tmp_path / "no-gcloud"))


def _service_account(tmp_path: Path, token_uri: str) -> Path:
    from cryptography.hazmat.primitives import serialization
    from cryptography.hazmat.primitives.asymmetric import rsa

    key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    pem = key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                            serialization.NoEncryption()).decode()
    account = {"type": "service_account", "project_id": "p", "private_key_id": "k1", "private_key": pem,
               "client_email": "reader@p.iam.gserviceaccount.com", "client_id": "1", "token_uri": token_uri}
    path = tmp_path / "sa.json"
    path.write_text(json.dumps(account))
    return path


class Retries:
    def __init__(self) -> None:
        self.seen: list[tuple[str, bool]] = []

    def on_retry(self, url: str, attempt: int, cause: BaseException, throttled: bool) -> None:
        self.seen.append((url, throttled))

    def on_bytes(self, count: int) -> None:
        pass


async def _roundtrip(proxy: FaultProxy, tmp_path: Path, events: Retries | None = None) -> bytes:
    (tmp_path / "src").write_bytes(PAYLOAD)
    url = "gs://astream-test/auth/a.bin"
    async with StoragePool(configure("gs://astream-test", {"endpoint_url": proxy.url}, FAST), events) as pool:
        storage = pool.get(url)
        await storage.put(str(tmp_path / "src"), url)
        return await storage.read_bytes(url)


@pytest.mark.usefixtures("no_google_env")
async def test_service_account_token_survives_throttling_and_resets(
    gcs: str, token_server: TokenServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with FaultProxy(token_server.url) as auth, FaultProxy(gcs) as storage:
        monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(_service_account(tmp_path, f"{auth.url}/token")))
        # Three failures, one more than FAST's two retries would survive if the token fetch
        # were not retried: the attempts below are astream's, and one token serves both requests.
        auth.add(Fault("status", match="/token", status=503, retry_after="0", times=1))
        auth.add(Fault("status", match="/token", status=429, retry_after="0", times=1))
        events = Retries()
        got = await _roundtrip(storage, tmp_path, events)
        assert got == PAYLOAD
        assert auth.count("/token", "POST") == 3
        assert events.seen == [(f"{auth.url}/token", True), (f"{auth.url}/token", True)]  # counted as throttling
        assert token_server.grants[-1] == "urn:ietf:params:oauth:grant-type:jwt-bearer"
        assert set(storage.authorizations) == {f"Bearer {TOKEN}"}  # the upload and the read

        auth.clear()
        auth.add(Fault("reset", match="/token", after=5, times=1))
        assert await _roundtrip(storage, tmp_path) == PAYLOAD  # a fresh pool: a fresh token
        assert auth.count("/token", "POST") == 2


@pytest.mark.usefixtures("no_google_env")
async def test_token_endpoint_failures_end_as_named_errors(
    gcs: str, token_server: TokenServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with FaultProxy(token_server.url) as auth, FaultProxy(gcs) as storage:
        monkeypatch.setenv("GOOGLE_APPLICATION_CREDENTIALS", str(_service_account(tmp_path, f"{auth.url}/token")))
        auth.add(Fault("status", match="/token", status=503, retry_after="0", times=None))
        with pytest.raises(DownloadError, match=r"/token: download failed after 3 attempts.*503"):
            await _roundtrip(storage, tmp_path)
        assert auth.count("/token", "POST") == 3  # astream's download_retry=2, not gcloud-aio-auth's 5
        assert storage.log == []  # nothing was sent to the bucket without a token

        auth.clear()
        auth.add(Fault("status", match="/token", status=401, times=None))
        with pytest.raises(AccessDeniedError, match="GOOGLE_APPLICATION_CREDENTIALS"):
            await _roundtrip(storage, tmp_path)
        assert auth.count("/token", "POST") == 1  # a refusal is not retried


@pytest.mark.usefixtures("no_google_env")
async def test_metadata_server_credentials(
    gcs: str, token_server: TokenServer, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with FaultProxy(token_server.url) as metadata, FaultProxy(gcs) as storage:
        # Set after gcloud-aio-auth was imported (it reads the variable once, at import).
        monkeypatch.setenv("GCE_METADATA_HOST", metadata.url.removeprefix("http://"))
        metadata.add(Fault("status", match="/computeMetadata/*", status=503, retry_after="0", times=1))
        asked = len(token_server.metadata)
        assert await _roundtrip(storage, tmp_path) == PAYLOAD
        assert metadata.count("/computeMetadata/v1/instance/service-accounts/default/token*", "GET") == 2
        assert token_server.metadata[asked:] == ["Google"]  # the 503 never reached it
        assert set(storage.authorizations) == {f"Bearer {TOKEN}"}


@pytest.mark.usefixtures("no_google_env")
async def test_no_credentials_and_no_metadata_server(
    gcs: str, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("GCE_METADATA_HOST", f"{HOST}:{free_port()}")  # nothing listens there
    with FaultProxy(gcs) as storage:
        with pytest.raises(AccessDeniedError, match=r"no Google credentials found.*GOOGLE_APPLICATION_CREDENTIALS"):
            await _roundtrip(storage, tmp_path)
        assert storage.log == []
