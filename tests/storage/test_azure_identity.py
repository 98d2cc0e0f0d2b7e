"""``azure://`` with ``DefaultAzureCredential``: a managed identity's token, used by Azurite.

A loopback aiohttp server plays the App Service managed-identity endpoint (azure-identity
asks ``IDENTITY_ENDPOINT`` with the ``X-IDENTITY-HEADER`` secret of ``IDENTITY_HEADER``);
Azurite serves HTTPS (a trustme CA) with ``--oauth basic``, which accepts a bearer token
whose issuer, audience and validity times are right (it does not check the signature) and
refuses one whose audience is wrong, so a wrong or missing token makes the test fail.
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from aiohttp import web

from astream._storage.loop import LoopThread
from astream._storage.registry import StoragePool, configure
from astream.errors import AccessDeniedError
from astream.testing import HOST, free_port

from .conftest import FAST
from .emulators import AZURITE_ACCOUNT, azurite

pytest.importorskip("azure.identity")
jwt = pytest.importorskip("jwt")
trustme = pytest.importorskip("trustme")

SECRET = "identity-header-secret"
PAYLOAD = b"payload-" * 1000


def _jwt(audience: str) -> str:
    now = int(time.time())
    claims = {"aud": audience, "iss": "https://sts.windows.net/00000000-0000-0000-0000-000000000001/",
              "nbf": now - 60, "iat": now - 60, "exp": now + 3600, "oid": "astream-test"}
    return str(jwt.encode(claims, "azurite-checks-no-signature-of-this-token-at-all", algorithm="HS256"))


class Identity:
    """The managed-identity endpoint; ``audience`` is what the next tokens say."""

    def __init__(self) -> None:
        self.asked: list[dict[str, str]] = []
        self.audience = "https://storage.azure.com"
        self.url = ""


@pytest.fixture(scope="module")
def tls(tmp_path_factory: pytest.TempPathFactory) -> tuple[str, str, str]:
    ca = trustme.CA()
    cert = ca.issue_cert(HOST)
    folder = tmp_path_factory.mktemp("tls")
    cert.cert_chain_pems[0].write_to_path(str(folder / "cert.pem"))
    cert.private_key_pem.write_to_path(str(folder / "key.pem"))
    ca.cert_pem.write_to_path(str(folder / "ca.pem"))
    return str(folder / "cert.pem"), str(folder / "key.pem"), str(folder / "ca.pem")


@pytest.fixture(scope="module")
def azurite_https(tls: tuple[str, str, str]) -> Iterator[str]:
    with azurite("astream-test", tls=tls) as url:
        yield url


@pytest.fixture(scope="module")
def identity() -> Iterator[Identity]:
    state = Identity()

    async def token(request: web.Request) -> web.Response:
        state.asked.append({**request.query, "X-IDENTITY-HEADER": request.headers.get("X-IDENTITY-HEADER", "")})
        if request.headers.get("X-IDENTITY-HEADER") != SECRET:
            return web.json_response({"error": "invalid identity header"}, status=400)
        return web.json_response({"access_token": _jwt(state.audience), "expires_on": str(int(time.time()) + 3600),
                                  "resource": request.query.get("resource", ""), "token_type": "Bearer"})

    port = free_port()

    async def start() -> web.AppRunner:
        app = web.Application()
        app.router.add_get("/msi/token", token)
        runner = web.AppRunner(app, access_log=None, handle_signals=False)
        await runner.setup()
        await web.TCPSite(runner, HOST, port).start()
        return runner

    thread = LoopThread("identity-server")
    runner = thread.call(start())
    state.url = f"http://{HOST}:{port}/msi/token"
    try:
        yield state
    finally:
        thread.call(runner.cleanup())
        thread.close()


@pytest.fixture
def managed_identity_env(identity: Identity, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Identity:
    """Only the App Service managed identity is configured (nothing else in the chain is)."""
    for name in ("AZURE_STORAGE_CONNECTION_STRING", "AZURE_ACCOUNT_NAME", "AZURE_ACCOUNT_ACCESS_KEY",
                 "AZURE_CLIENT_ID", "AZURE_CLIENT_SECRET", "AZURE_TENANT_ID", "AZURE_USERNAME",
                 "AZURE_FEDERATED_TOKEN_FILE", "IMDS_ENDPOINT", "MSI_ENDPOINT", "MSI_SECRET"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("IDENTITY_ENDPOINT", identity.url)
    monkeypatch.setenv("IDENTITY_HEADER", SECRET)
    monkeypatch.setenv("HOME", str(tmp_path))  # no Azure CLI profile or token cache of the user's
    monkeypatch.setenv("PATH", "/nonexistent")  # no `az`/`azd`/`pwsh` for the chain to run
    identity.asked.clear()
    identity.audience = "https://storage.azure.com"
    return identity


def _options(azurite_https: str, ca: str) -> Any:
    return configure("azure://astream-test", {"account_name": AZURITE_ACCOUNT, "ca_bundle": ca,
                                              "endpoint_url": f"{azurite_https}/{AZURITE_ACCOUNT}"}, FAST)


async def test_default_credential_managed_identity_token_used_for_upload_and_read(
    azurite_https: str, tls: tuple[str, str, str], managed_identity_env: Identity, tmp_path: Path
) -> None:
    (tmp_path / "src").write_bytes(PAYLOAD)
    url = "azure://astream-test/mi/a.bin"
    async with StoragePool(_options(azurite_https, tls[2])) as pool:
        storage = pool.get(url)
        await storage.put(str(tmp_path / "src"), url)
        assert await storage.read_bytes(url) == PAYLOAD
        assert (await storage.stat(url)).size == len(PAYLOAD)
    asked = managed_identity_env.asked
    assert asked
    assert {a["resource"] for a in asked} == {"https://storage.azure.com"}
    assert {a["X-IDENTITY-HEADER"] for a in asked} == {SECRET}


async def test_a_token_azurite_refuses_is_access_denied(
    azurite_https: str, tls: tuple[str, str, str], managed_identity_env: Identity
) -> None:
    managed_identity_env.audience = "https://vault.azure.net"  # a token for another service
    url = "azure://astream-test/mi/none.bin"
    async with StoragePool(_options(azurite_https, tls[2])) as pool:
        with pytest.raises(AccessDeniedError, match=r"HTTP 403.*AZURE_STORAGE_CONNECTION_STRING"):
            await pool.get(url).read_bytes(url)
    assert managed_identity_env.asked


async def test_a_refused_identity_is_access_denied(
    azurite_https: str, tls: tuple[str, str, str], managed_identity_env: Identity, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("IDENTITY_HEADER", "wrong-secret")
    url = "azure://astream-test/mi/none.bin"
    async with StoragePool(_options(azurite_https, tls[2])) as pool:
        with pytest.raises(AccessDeniedError, match="no usable Azure credentials"):
            await pool.get(url).read_bytes(url)
    assert managed_identity_env.asked
