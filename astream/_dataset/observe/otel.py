"""The OpenTelemetry exporter (extra ``otel``): observable instruments over every live loader.

:func:`enable_otel` creates the instruments of :data:`astream._dataset.observe.metrics.METRICS`
on a meter of the OpenTelemetry metrics API. Until the application installs an SDK
``MeterProvider`` (and a reader or exporter on it) the API is a no-op and nothing is
ever read; with one, each collection reads every live loader once (a snapshot shared
by all instruments of that collection). Counters are observable counters, gauges
observable gauges; the ``next()`` wait histogram is exported as its count and sum
(``astream_next_wait_count`` / ``astream_next_wait_sum``) beside the p50/p99 gauges,
because observable instruments cannot carry buckets.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable, Iterable
from typing import Any

from astream._dataset.observe.metrics import METRICS, snapshots
from astream._dataset.observe.stats import Stats
from astream.errors import ConfigError

__all__ = ["enable_otel"]

# Instruments of one collection ask within this many seconds: they share one snapshot.
_SHARED_S = 0.5


class _Shared:
    """One snapshot of every loader per collection, whichever instrument asks first."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._at = -1.0
        self._taken: list[tuple[dict[str, str], Stats]] = []

    def get(self) -> list[tuple[dict[str, str], Stats]]:
        with self._lock:
            now = time.monotonic()
            if now - self._at > _SHARED_S:
                self._taken, self._at = snapshots(), now
            return self._taken


def _callback(api: Any, shared: _Shared, read: Callable[[Stats], Any], per_stage: bool) -> Callable[[Any], Iterable[Any]]:
    def observe(_options: Any) -> Iterable[Any]:
        out: list[Any] = []
        for labels, stats in shared.get():
            if per_stage:
                out.extend(api.Observation(float(v), {**labels, "stage": k}) for k, v in read(stats).items())
            else:
                out.append(api.Observation(float(read(stats)), labels))
        return out

    return observe


def enable_otel(meter_provider: Any = None) -> list[Any]:
    """Create astream's instruments on ``meter_provider`` (default: the global one).

    Returns:
        The instruments (keep nothing: the provider holds them).

    Raises:
        ConfigError: opentelemetry-api is not installed.
    """
    try:
        import opentelemetry.metrics as api
    except ImportError as exc:
        raise ConfigError("the OpenTelemetry exporter needs opentelemetry-api: pip install 'astream[otel]'") from exc
    meter = (meter_provider or api.get_meter_provider()).get_meter("astream")
    shared = _Shared()
    made = []
    for metric in METRICS:
        if metric.kind == "histogram":
            made.append(meter.create_observable_counter(
                f"{metric.name}_count", callbacks=[_callback(api, shared, lambda s: s.batches, False)], unit="1",
                description=f"{metric.description}: how many"))
            made.append(meter.create_observable_counter(
                f"{metric.name}_sum", callbacks=[_callback(api, shared, lambda s: s.consumer_wait_s, False)],
                unit=metric.unit, description=f"{metric.description}: their sum"))
            continue
        make = meter.create_observable_counter if metric.kind == "counter" else meter.create_observable_gauge
        made.append(make(metric.name, callbacks=[_callback(api, shared, metric.read, metric.per_stage)],
                         unit=metric.unit, description=metric.description))
    return made


