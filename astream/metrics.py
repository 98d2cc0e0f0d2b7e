"""Exporters of astream's figures, never on by default.

``Loader.stats()`` is always there; these publish the same figures of every live loader
of the process (its worker processes' included) to a metrics system::

    from astream.metrics import enable_otel, enable_prometheus

    enable_otel()                  # OpenTelemetry metrics API (extra ``otel``): a no-op
                                   # until the application installs an SDK MeterProvider
    enable_prometheus(port=9100)   # a Prometheus collector (extra ``prometheus``), here
                                   # also served on :9100/metrics

or set ``ASTREAM_PROMETHEUS_PORT=9100`` (each rank of a node serves on that port plus its
local rank). The metric names are in docs/guide/metrics.md and :data:`METRICS`.
"""

from __future__ import annotations

from astream._dataset.observe.metrics import METRICS, Metric
from astream._dataset.observe.otel import enable_otel
from astream._dataset.observe.prometheus import enable_prometheus, prometheus_name

__all__ = ["METRICS", "Metric", "enable_otel", "enable_prometheus", "prometheus_name"]
