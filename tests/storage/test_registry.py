"""The public registry, entry points, unknown schemes, and ``storage_options`` end to end."""

from __future__ import annotations

import pickle
import ssl
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import astream
from astream import MDSWriter, Stream, StreamingDataset
from astream._storage import StorageOptions
from astream._storage.config import RemoteConfig
from astream._storage.http import HttpStorage
from astream._storage.registry import StoragePool, configure, storage_class
from astream.errors import AccessDeniedError, ConfigError
from astream.testing import LoopbackServer, MemoryStorage, memory_bucket


class _Tagged(MemoryStorage):
    """The in-memory backend under another scheme, reading one option."""

    schemes = ("tagged",)
    option_keys = frozenset({"tag"})

    def _locate(self, url: str) -> tuple[dict[str, bytes], str]:  # type: ignore[override]
        return MemoryStorage._locate("memory://" + url.split("://", 1)[1])


def test_register_storage_is_public_and_serves_the_scheme() -> None:
    astream.register_storage("tagged", _Tagged)
    memory_bucket("reg")["k"] = b"v"
    options = configure("tagged://reg/k", {"tag": "x"})
    assert options.remote.get("tag") == "x"
    with pytest.raises(ConfigError, match="unknown key 'colour'"):
        configure("tagged://reg/k", {"colour": "red"})


async def test_pool_keeps_one_backend_per_remote_config() -> None:
    astream.register_storage("tagged", _Tagged)
    memory_bucket("reg")["k"] = b"v"
    async with StoragePool() as pool:
        a = pool.get("tagged://reg/k", RemoteConfig.of({"tag": "a"}))
        assert pool.get("tagged://reg/other", RemoteConfig.of({"tag": "a"})) is a
        b = pool.get("tagged://reg/k", RemoteConfig.of({"tag": "b"}))
        assert b is not a
        assert b.options.remote.get("tag") == "b"
        assert await b.read_bytes("tagged://reg/k") == b"v"


def test_register_storage_refuses_bad_input() -> None:
    with pytest.raises(ConfigError, match="not a URL scheme"):
        astream.register_storage("oci://", _Tagged)
    with pytest.raises(ConfigError, match="callable"):
        astream.register_storage("oci", "nope")  # type: ignore[arg-type]


def test_unknown_scheme_lists_the_known_ones_and_their_extras() -> None:
    with pytest.raises(ConfigError) as info:
        storage_class("oci://bucket/ds")
    message = str(info.value)
    assert "unsupported scheme 'oci'" in message
    for part in ("gs:// (pip install 'astream[gcs]')", "azure:// (pip install 'astream[azure]')", "s3://", "hf://",
                 "register_storage", "astream.storage"):
        assert part in message


def test_entry_point_adds_a_scheme(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    # A real installed distribution (a .dist-info folder on sys.path), as `pip install` leaves.
    (tmp_path / "astream_plugin_demo.py").write_text(
        "from astream.testing import MemoryStorage\n"
        "class Demo(MemoryStorage):\n"
        "    def _locate(self, url):\n"
        "        return MemoryStorage._locate('memory://' + url.split('://', 1)[1])\n"
    )
    info = tmp_path / "astream_plugin_demo-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: astream-plugin-demo\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[astream.storage]\ndemo = astream_plugin_demo:Demo\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    from astream._storage import registry

    monkeypatch.setattr(registry, "_entry_points_loaded", False)
    monkeypatch.setattr(registry, "_FACTORIES", dict(registry._FACTORIES))
    factory = storage_class("demo://b/k")
    assert factory.__name__ == "Demo"
    del sys.modules["astream_plugin_demo"]


def test_storage_options_unknown_key_is_refused_everywhere(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="unknown key 'endpoint'"):
        Stream(remote="s3://b/ds", storage_options={"endpoint": "http://x"})
    with pytest.raises(ConfigError, match="unknown key 'bogus'"):
        StreamingDataset(remote="http://127.0.0.1:9/ds", local=str(tmp_path), storage_options={"bogus": 1})
    with pytest.raises(ConfigError, match="unknown key 'bogus'"):
        MDSWriter(out="memory://w/ds", columns={"x": "int"}, storage_options={"bogus": 1})
    with pytest.raises(ConfigError, match="names no remote"):
        MDSWriter(out=str(tmp_path / "w"), columns={"x": "int"}, storage_options={"headers": {}})
    with pytest.raises(ConfigError, match="must be picklable"):
        Stream(remote="http://h/ds", storage_options={"headers": {"a": object()}})


def test_storage_options_are_frozen_picklable_and_hashable() -> None:
    s = Stream(remote="https://h/ds", storage_options={"headers": {"Authorization": "Bearer t"}, "timeout": 5})
    assert isinstance(s.storage_options, RemoteConfig)
    assert pickle.loads(pickle.dumps(s)) == s
    hash(s.storage_options)
    options = configure("https://h/ds", s.storage_options, StorageOptions())
    assert options.timeouts.download == 5
    assert options.remote.headers("https://h") == {"Authorization": "Bearer t"}


def _tls(tmp_path: Path) -> tuple[ssl.SSLContext, str]:
    trustme = pytest.importorskip("trustme")
    ca = trustme.CA()
    cert = ca.issue_cert("127.0.0.1")
    server_ctx = ssl.create_default_context(ssl.Purpose.CLIENT_AUTH)
    cert.configure_cert(server_ctx)
    bundle = tmp_path / "ca.pem"
    ca.cert_pem.write_to_path(str(bundle))
    return server_ctx, str(bundle)


def _dataset(root: Path, n: int = 40) -> None:
    with MDSWriter(out=str(root), columns={"x": "int", "v": "ndarray:float32:4"}, size_limit=600) as w:
        for i in range(n):
            w.write({"x": i, "v": np.full(4, i, np.float32)})


def test_https_with_a_private_ca_and_a_bearer_token(tmp_path: Path) -> None:
    server_ctx, bundle = _tls(tmp_path)
    _dataset(tmp_path / "remote")
    token = {"Authorization": "Bearer s3cret"}
    with LoopbackServer(str(tmp_path / "remote"), ssl_context=server_ctx, require_headers=token) as srv:
        assert srv.url.startswith("https://127.0.0.1:")
        good = {"ca_bundle": bundle, "headers": token}
        ds = StreamingDataset(remote=srv.url, local=str(tmp_path / "c1"), storage_options=good)
        assert [int(s["x"]) for s in ds] == list(range(40))
        # The options are part of the dataset's configuration (spawned workers get them).
        assert pickle.loads(pickle.dumps(ds)).streams[0].storage_options == RemoteConfig.of(good)
        with pytest.raises(AccessDeniedError, match="Authorization"):
            StreamingDataset(remote=srv.url, local=str(tmp_path / "c2"), storage_options={"ca_bundle": bundle})
        with pytest.raises(astream.errors.DownloadError):  # the CA is not trusted without the bundle
            StreamingDataset(remote=srv.url, local=str(tmp_path / "c3"), storage_options={"headers": token},
                             download_retry=0)


async def test_http_headers_reach_every_request(tmp_path: Path) -> None:
    (tmp_path / "r").mkdir()
    (tmp_path / "r" / "f.bin").write_bytes(b"abcdef")
    with LoopbackServer(str(tmp_path / "r"), require_headers={"X-Key": "k"}) as srv:
        storage: Any = HttpStorage(configure(srv.url, {"headers": {"X-Key": "k"}}))
        async with storage:
            assert await storage.exists(f"{srv.url}/f.bin")
            assert await storage.read_range(f"{srv.url}/f.bin", 1, 3) == b"bc"
            assert await storage.read_bytes(f"{srv.url}/f.bin") == b"abcdef"


def test_registry_keys_are_the_backends_own() -> None:
    from astream._storage import registry
    from astream._storage.azure import AzureStorage
    from astream._storage.gcs import OPTION_KEYS
    from astream._storage.hf import HfStorage
    from astream._storage.s3 import S3Storage

    for scheme, keys in (("http", HttpStorage.option_keys), ("s3", S3Storage.option_keys), ("gs", OPTION_KEYS),
                         ("azure", AzureStorage.option_keys), ("hf", HfStorage.option_keys)):
        assert registry._BUILTIN[scheme].keys == keys, scheme
