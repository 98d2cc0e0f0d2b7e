"""No secret in a repr, a message, a log or a metric; credentials stay with the origin
they were given for; the Prometheus exporter listens on loopback (issue 32, finding 9)."""

from __future__ import annotations

import http.server
import logging
import threading
from collections.abc import Iterator
from pathlib import Path

import pytest

from astream import MDSWriter, Stream, StreamingDataset
from astream._storage import StorageOptions
from astream._storage.config import RemoteConfig
from astream._storage.http import HttpStorage
from astream.errors import AstreamError, ConfigError
from astream.testing import LoopbackServer

SECRETS = {"Authorization": "Bearer SECRET-TOKEN-1", "X-Api-Key": "SECRET-KEY-2"}


def _clean(text: str) -> None:
    assert "SECRET" not in text, text


@pytest.mark.parametrize("options", [
    {"headers": SECRETS},
    {"key": "AKIAEXAMPLE", "secret": "SECRET-S3", "token": "SECRET-SESSION", "endpoint_url": "http://127.0.0.1:1"},
    {"account_name": "acct", "account_key": "SECRET-AZ", "sas_token": "SECRET-SAS",
     "connection_string": "AccountKey=SECRET-CS"},
    {"token": "SECRET-HF", "hmac_secret": "SECRET-HMAC"},
])
def test_reprs_mask_every_secret(options: dict[str, object]) -> None:
    config = RemoteConfig.of(options)
    _clean(repr(config))
    _clean(repr(Stream(remote="https://127.0.0.1:1/ds", storage_options={"headers": SECRETS})))
    _clean(repr(StorageOptions(remote=config)))
    assert "endpoint_url='http://127.0.0.1:1'" in repr(config) or "endpoint_url" not in options  # where: shown


def test_a_dataset_says_nothing_of_its_headers(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    with MDSWriter(out=str(tmp_path / "ds"), columns={"x": "int"}) as writer:
        for i in range(20):
            writer.write({"x": i})
    caplog.set_level(logging.DEBUG, logger="astream")
    with LoopbackServer(str(tmp_path / "ds"), require_headers=SECRETS) as server:
        ds = StreamingDataset(remote=server.url, local=str(tmp_path / "c"), batch_size=5,
                              storage_options={"headers": SECRETS})
        try:
            assert sorted(int(s["x"]) for s in ds) == list(range(20))
            for text in (repr(ds), repr(ds.streams), repr(ds.config), str(ds.stats())):
                _clean(text)
        finally:
            ds.close()
        with pytest.raises(AstreamError) as refused:  # a 401 names the URL, not what was sent
            StreamingDataset(remote=server.url, local=str(tmp_path / "c2"),
                             storage_options={"headers": {"Authorization": "Bearer SECRET-WRONG"}})
        _clean(str(refused.value))
    _clean(caplog.text)


def test_a_bad_headers_value_is_not_echoed() -> None:
    with pytest.raises(ConfigError, match="headers must map strings to strings") as bad:
        HttpStorage(StorageOptions(remote=RemoteConfig.of({"headers": {"Authorization": "Bearer SECRET-1",
                                                                       "X-Api-Key": 42}})))
    _clean(str(bad.value))
    assert "'X-Api-Key': <int>" in str(bad.value)


def test_credentials_in_a_url_are_refused_unshown() -> None:
    with pytest.raises(ConfigError, match="carries credentials in its URL") as bad:
        StreamingDataset(remote="https://bob:SECRET-PW@127.0.0.1:1/ds", local="/nonexistent/x")
    _clean(str(bad.value))


class _Recorder(http.server.BaseHTTPRequestHandler):
    """``/away/*``: 302 to the other server; ``/here/*``: 302 to ``/data`` on this one; else 200."""

    seen: list[tuple[int, str, dict[str, str]]]
    other: str

    def do_GET(self) -> None:
        self.seen.append((self.server.server_address[1], self.path, dict(self.headers)))
        if self.path.startswith(("/away/", "/here/")):
            where = f"{self.other}/data" if self.path.startswith("/away/") else "/data"
            self.send_response(302)
            self.send_header("Location", where)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        body = b"payload"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        pass


@pytest.fixture
def two_origins() -> Iterator[tuple[str, str, list[tuple[int, str, dict[str, str]]]]]:
    seen: list[tuple[int, str, dict[str, str]]] = []
    servers = []
    for _ in range(2):
        handler = type("Handler", (_Recorder,), {"seen": seen, "other": ""})
        server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), handler)
        threading.Thread(target=server.serve_forever, daemon=True).start()
        servers.append(server)
    a, b = (f"http://127.0.0.1:{s.server_address[1]}" for s in servers)
    servers[0].RequestHandlerClass.other = b  # type: ignore[attr-defined]
    try:
        yield a, b, seen
    finally:
        for server in servers:
            server.shutdown()
            server.server_close()


async def test_credential_headers_stay_with_their_origin(
    two_origins: tuple[str, str, list[tuple[int, str, dict[str, str]]]],
) -> None:
    a, b, seen = two_origins
    b_port = int(b.rsplit(":", 1)[1])
    async with HttpStorage(StorageOptions(remote=RemoteConfig.of({"headers": SECRETS}))) as storage:
        assert await storage.read_bytes(f"{a}/away/x") == b"payload"
        assert await storage.read_bytes(f"{a}/here/x") == b"payload"
    away = [h for port, path, h in seen if port == b_port]
    assert len(away) == 1
    assert not {k.lower() for k in away[0]} & {k.lower() for k in SECRETS}, away[0]  # another origin: none
    home = [h for port, path, h in seen if port != b_port and path == "/data"]
    assert home
    assert home[0].get("X-Api-Key") == SECRETS["X-Api-Key"]  # a redirect on its own origin keeps them


def test_the_prometheus_exporter_listens_on_loopback() -> None:
    prometheus_client = pytest.importorskip("prometheus_client", reason="the prometheus extra is not installed")
    from astream._dataset.observe.prometheus import enable_prometheus

    server = enable_prometheus(prometheus_client.CollectorRegistry(), port=0)
    try:
        assert server.server_address[0] == "127.0.0.1"
    finally:
        server.shutdown()
        server.server_close()
