"""The exporters (issue #20), offline: a private Prometheus registry and OpenTelemetry's
in-memory reader, over loaders with worker processes against a loopback server."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from astream import Loader, MDSWriter, StreamingDataset
from astream._dataset.observe.metrics import LOADERS, METRICS
from astream.errors import ConfigError
from astream.metrics import enable_otel, enable_prometheus, prometheus_name
from astream.testing import LoopbackServer

N = 48
BATCH = 4


@pytest.fixture(scope="module")
def served(tmp_path_factory: pytest.TempPathFactory):
    root = tmp_path_factory.mktemp("remote")
    with MDSWriter(out=str(root / "ds"), columns={"id": "int64", "x": "ndarray:uint8:200"}, size_limit="2kb") as w:
        for i in range(N):
            w.write({"id": i, "x": np.full(200, i % 256, np.uint8)})
    with LoopbackServer(root) as server:
        yield server


def two_epochs(url: str, cache: Path) -> tuple[Loader, Any]:
    """Two epochs with two worker processes (the second in the processes kept from the first)."""
    ds = StreamingDataset(remote=url, local=str(cache), batch_size=BATCH)
    loader = Loader(ds, num_workers=2)
    for _ in range(2):
        assert sum(len(b["id"]) for b in loader) == N
    return loader, loader.stats()


def test_prometheus_collects_every_loader_with_its_workers(served: LoopbackServer, tmp_path: Path) -> None:
    prom = pytest.importorskip("prometheus_client")
    registry = prom.CollectorRegistry()
    assert enable_prometheus(registry) is None
    enable_prometheus(registry)  # twice: registered once (a second register would raise)
    loader, stats = two_epochs(f"{served.url}/ds", tmp_path / "cache")
    try:
        labels = {"loader": str(LOADERS[loader]), "rank": "0", "node": "0"}

        def get(name: str, **extra: str) -> float | None:
            return registry.get_sample_value(name, {**labels, **extra})

        batches = 2 * N // BATCH
        assert get("astream_batches_total") == batches
        assert get("astream_samples_total") == 2 * N
        assert get("astream_next_wait_seconds_count") == batches
        assert get("astream_next_wait_seconds_bucket", le="+Inf") == batches
        assert get("astream_next_wait_seconds_sum") >= stats.consumer_wait_s
        # the worker processes' reads and transforms reached this process
        assert get("astream_stage_calls_total", stage="read") >= batches
        assert get("astream_stage_calls_total", stage="transport") >= N // BATCH
        assert get("astream_stage_seconds_total", stage="download") > 0
        assert get("astream_node_downloaded_bytes_total") == stats.bytes_downloaded > 0
        assert get("astream_node_shards_downloaded_total") == len(loader.dataset.indexes[0].shards)
        assert get("astream_node_evictions_total") == 0
        assert 0.0 <= get("astream_readiness") <= 1.0
        text = prom.generate_latest(registry).decode()
        for metric in METRICS:
            assert prometheus_name(metric) in text, metric.name
    finally:
        loader.close()
        loader.dataset.close()


def test_opentelemetry_in_memory_reader_with_worker_processes(served: LoopbackServer, tmp_path: Path) -> None:
    pytest.importorskip("opentelemetry.sdk.metrics")
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import InMemoryMetricReader

    reader = InMemoryMetricReader()
    provider = MeterProvider(metric_readers=[reader])
    instruments = enable_otel(provider)
    assert len(instruments) == len(METRICS) + 1  # the histogram as a count and a sum
    loader, stats = two_epochs(f"{served.url}/ds", tmp_path / "cache")
    try:
        mine = {"loader": str(LOADERS[loader]), "rank": "0", "node": "0"}
        points: dict[tuple[str, str], float] = {}
        for resource in reader.get_metrics_data().resource_metrics:
            for scope in resource.scope_metrics:
                for metric in scope.metrics:
                    for point in metric.data.data_points:
                        attrs = dict(point.attributes)
                        if {k: attrs.get(k) for k in mine} == mine:
                            points[(metric.name, str(attrs.get("stage", "")))] = point.value
        batches = 2 * N // BATCH
        assert points[("astream_batches", "")] == batches
        assert points[("astream_next_wait_count", "")] == batches
        assert points[("astream_node_downloaded", "")] == stats.bytes_downloaded
        assert points[("astream_stage_calls", "read")] >= batches
        assert points[("astream_stage_calls", "transport")] >= N // BATCH
        assert points[("astream_stall", "")] == pytest.approx(stats.stall, abs=0.2)
    finally:
        provider.shutdown()
        loader.close()
        loader.dataset.close()


_SCRIPT = """
import json, sys, urllib.request
from astream import Loader, StreamingDataset
ds = StreamingDataset(remote=sys.argv[1], local=sys.argv[2], batch_size=4)
loader = Loader(ds)  # the first Loader starts the exporter ASTREAM_PROMETHEUS_PORT asks for
n = sum(len(b["id"]) for b in loader)
text = urllib.request.urlopen(f"http://127.0.0.1:{sys.argv[3]}/metrics", timeout=10).read().decode()
print(json.dumps({"n": n, "lines": [l for l in text.splitlines() if l.startswith("astream_batches_total")]}))
ds.close()
"""


def test_prometheus_opt_in_by_environment_variable(served: LoopbackServer, tmp_path: Path) -> None:
    pytest.importorskip("prometheus_client")
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    env = {**os.environ, "ASTREAM_PROMETHEUS_PORT": str(port), "ASTREAM_PROMETHEUS_ADDR": "127.0.0.1"}
    out = subprocess.run([sys.executable, "-c", _SCRIPT, f"{served.url}/ds", str(tmp_path / "cache"), str(port)],
                         env=env, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    result = json.loads(out.stdout)
    assert result["n"] == N
    assert result["lines"] == [f'astream_batches_total{{loader="0",node="0",rank="0"}} {N // 4}.0']


def test_a_missing_package_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setitem(sys.modules, "prometheus_client", None)
    monkeypatch.setitem(sys.modules, "opentelemetry", None)
    with pytest.raises(ConfigError, match=r"astream\[prometheus\]"):
        enable_prometheus()
    with pytest.raises(ConfigError, match=r"astream\[otel\]"):
        enable_otel()


def test_every_metric_is_documented() -> None:
    page = (Path(__file__).resolve().parents[2] / "docs" / "guide" / "metrics.md").read_text()
    for metric in METRICS:
        assert f"`{prometheus_name(metric)}" in page, metric.name
        assert f"`{metric.name}" in page, metric.name
