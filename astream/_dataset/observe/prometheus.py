"""The Prometheus bridge (extra ``prometheus``): a collector over every live loader.

Off until asked: :func:`enable_prometheus` registers the collector (on a registry of the
caller's, or prometheus_client's default one) and, with a port, serves it over HTTP;
``ASTREAM_PROMETHEUS_PORT`` (and ``ASTREAM_PROMETHEUS_ADDR``, default ``127.0.0.1``) does
the same when the process makes its first ``Loader`` (each rank of a node on that port
plus its local rank). Values are read at scrape time
(:func:`astream._dataset.observe.metrics.snapshots`: one round trip to the node agent per loader),
so nothing is counted twice and worker processes need no exporter of their own: their
figures reach the loader's process. Counters get ``_total``, seconds ``_seconds`` and
bytes ``_bytes`` (Prometheus' naming).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Iterator
from typing import Any

from astream._dataset.observe.metrics import METRICS, Metric, snapshots
from astream.errors import ConfigError

__all__ = ["ENV_ADDR", "ENV_PORT", "enable_from_env", "enable_prometheus", "prometheus_name"]

ENV_PORT = "ASTREAM_PROMETHEUS_PORT"
ENV_ADDR = "ASTREAM_PROMETHEUS_ADDR"
_lock = threading.Lock()
_registered: dict[int, Any] = {}  # id(registry) -> our collector on it
_from_env = False


def _client() -> Any:
    try:
        import prometheus_client
    except ImportError as exc:
        raise ConfigError("the Prometheus exporter needs prometheus-client: pip install 'astream[prometheus]'") from exc
    return prometheus_client


def prometheus_name(metric: Metric) -> str:
    """The metric's name as Prometheus shows it (before ``_total`` of counters)."""
    suffix = {"s": "_seconds", "By": "", "1": ""}[metric.unit]
    name = metric.name
    if metric.unit == "By" and not name.endswith("_bytes"):
        suffix = "_bytes"
    return name + suffix


class _Collector:
    """prometheus_client's custom collector protocol: ``collect()`` yields metric families."""

    def collect(self) -> Iterator[Any]:
        _client()
        from prometheus_client import core
        taken = snapshots()
        names = ["loader", "rank", "node"]
        for metric in METRICS:
            name = prometheus_name(metric)
            extra = ["stage"] if metric.per_stage else []
            family: Any  # one of prometheus_client's three metric families, by the metric's kind
            if metric.kind == "counter":
                family = core.CounterMetricFamily(name, metric.description, labels=names + extra)
            elif metric.kind == "gauge":
                family = core.GaugeMetricFamily(name, metric.description, labels=names + extra)
            else:
                family = core.HistogramMetricFamily(name, metric.description, labels=names)
            for labels, stats in taken:
                values = [labels[k] for k in names]
                if metric.kind == "histogram":
                    cumulative, buckets = 0, []
                    for bound, count in stats.wait_buckets:
                        cumulative += count
                        buckets.append(("+Inf" if bound == float("inf") else repr(bound), cumulative))
                    if not buckets or buckets[-1][0] != "+Inf":
                        buckets.append(("+Inf", cumulative))
                    family.add_metric(values, buckets, sum_value=stats.consumer_wait_s)
                elif metric.per_stage:
                    for stage, value in metric.read(stats).items():
                        family.add_metric([*values, stage], float(value))
                else:
                    family.add_metric(values, float(metric.read(stats)))
            yield family

    def describe(self) -> list[Any]:
        return []  # values are read at scrape time only (no collection at registration)


def enable_prometheus(registry: Any = None, *, port: int | None = None, addr: str = "127.0.0.1") -> Any:
    """Publish every live loader's :class:`~astream.Stats` to Prometheus.

    Args:
        registry: a ``prometheus_client.CollectorRegistry``; default the library's global one.
        port: also serve ``/metrics`` over HTTP on this port (0: any free one).
        addr: the address the HTTP server binds (loopback by default; "0.0.0.0" for a scraper on another host).

    Returns:
        The HTTP server when one was started (its ``server_port`` is the port), else None.
        Calling it again for the same registry adds nothing twice.

    Raises:
        ConfigError: prometheus-client is not installed.
    """
    client = _client()
    registry = registry if registry is not None else client.REGISTRY
    with _lock:
        if id(registry) not in _registered:
            collector = _Collector()
            registry.register(collector)
            _registered[id(registry)] = collector
    if port is None:
        return None
    server, _thread = client.start_http_server(port, addr=addr, registry=registry)
    return server


def enable_from_env(local_rank: int = 0) -> None:
    """Start the exporter once per process if ``ASTREAM_PROMETHEUS_PORT`` says so.

    Each rank of a node serves on that port plus its local rank (they share the host).
    """
    global _from_env
    port = os.environ.get(ENV_PORT)
    if not port or _from_env:
        return
    with _lock:
        if _from_env:
            return
        _from_env = True
    try:
        number = int(port)
    except ValueError as exc:
        raise ConfigError(f"{ENV_PORT}={port!r} is not a port number") from exc
    enable_prometheus(port=number + local_rank, addr=os.environ.get(ENV_ADDR, "127.0.0.1"))
