"""Real emulators on 127.0.0.1 for the cloud backends' tests: gcp-storage-emulator and Azurite.

Each is started by the tests themselves on a free port, bound to 127.0.0.1 only.
"""

from __future__ import annotations

import contextlib
import shutil
import socket
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from astream.testing import HOST, free_port

REPO = Path(__file__).resolve().parents[2]
# The Makefile installs Azurite here (npm install --prefix .venv/azurite azurite@3.35.0).
AZURITE = REPO / ".venv" / "azurite" / "node_modules" / ".bin" / "azurite-blob"
# Azurite's well-known development account (public, documented by Microsoft).
AZURITE_ACCOUNT = "devstoreaccount1"
AZURITE_KEY = "Eby8vdM02xNOcqFlqUwJPLlmEtlCDXJ1OUzFT50uSRZ6IFsuFq2UVErCz4I6tq/K1SZFPTOtr/KBHBeksoGMGw=="


def azurite_connection_string(blob_endpoint: str) -> str:
    """The connection string of Azurite's development account at ``blob_endpoint``."""
    return (
        f"DefaultEndpointsProtocol=http;AccountName={AZURITE_ACCOUNT};AccountKey={AZURITE_KEY};"
        f"BlobEndpoint={blob_endpoint}/{AZURITE_ACCOUNT};"
    )


def _wait_port(port: int, proc: subprocess.Popen[bytes] | None = None, timeout: float = 30.0) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc is not None and proc.poll() is not None:
            raise RuntimeError(f"the emulator exited with {proc.returncode} before listening")
        with contextlib.suppress(OSError):
            socket.create_connection((HOST, port), 0.2).close()
            return
        time.sleep(0.05)
    raise RuntimeError(f"nothing listens on {HOST}:{port} after {timeout} s")


@contextlib.contextmanager
def gcs_emulator(bucket: str = "astream-test") -> Iterator[str]:
    """gcp-storage-emulator in this process (a thread), in memory; yields its base URL."""
    server_mod = pytest.importorskip("gcp_storage_emulator.server")
    port = free_port()
    server = server_mod.create_server(HOST, port, in_memory=True, default_bucket=bucket)
    server.start()
    try:
        yield f"http://{HOST}:{port}"
    finally:
        server.stop()


def azurite_command() -> str | None:
    """The azurite-blob executable, or None (then the Azure tests skip, saying why)."""
    if shutil.which("node") is None:
        return None
    if AZURITE.exists():
        return str(AZURITE)
    return shutil.which("azurite-blob")


@contextlib.contextmanager
def azurite(container: str = "astream-test", tls: tuple[str, str, str] | None = None) -> Iterator[str]:
    """Azurite's blob service on 127.0.0.1, in memory, with ``container`` made; yields its base URL.

    Args:
        container: made before the URL is yielded.
        tls: ``(cert, key, ca)`` PEM files: serve HTTPS with ``--oauth basic`` (Azurite checks a
            bearer token's issuer, audience and times, not its signature, and only over HTTPS).
    """
    command = azurite_command()
    if command is None:
        pytest.skip("Azure tests need node and Azurite (`make test` installs azurite@3.35.0 when npm exists)")
    pytest.importorskip("azure.storage.blob")
    port = free_port()
    extra = ["--oauth", "basic", "--cert", tls[0], "--key", tls[1]] if tls else []
    proc = subprocess.Popen(
        [command, "--inMemoryPersistence", "--skipApiVersionCheck", "--loose",
         "--blobHost", HOST, "--blobPort", str(port), *extra],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )
    try:
        _wait_port(port, proc)
        url = f"{'https' if tls else 'http'}://{HOST}:{port}"
        from azure.storage.blob import BlobServiceClient

        conn = azurite_connection_string(url).replace("Protocol=http;", f"Protocol={url.split(':')[0]};")
        kwargs = {"connection_verify": tls[2]} if tls else {}
        BlobServiceClient.from_connection_string(conn, **kwargs).create_container(container)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
