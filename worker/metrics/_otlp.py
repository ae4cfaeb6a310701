"""The node's metrics through OTLP: what ``/metrics`` shows, converted and pushed.

The worker records each metric once, in ``prometheus_client`` (whose multiprocess files add
up the pool's children). Every ``OTEL_METRIC_EXPORT_INTERVAL`` the parent collects that same
registry, turns each family into OTLP data (counters → monotonic cumulative sums, gauges →
gauges, histograms → explicit-bucket cumulative histograms; the names stay the Prometheus
names, ``tracescore_runs_total`` included) and sends it with the SDK's OTLP/HTTP metric
exporter, which reads the endpoint, headers and timeout from the standard ``OTEL_EXPORTER_OTLP_*``
variables.
"""

from __future__ import annotations

import math
import os
import threading
import time
from collections import defaultdict
from collections.abc import Iterable
from typing import TYPE_CHECKING, Any

import structlog

if TYPE_CHECKING:
    from opentelemetry.sdk.metrics.export import MetricExporter, MetricsData
    from prometheus_client.registry import Collector

__all__ = ["OtlpMetricsPusher", "otlp_metrics_endpoint", "to_metrics_data"]

log = structlog.get_logger("tracescore.worker.metrics")

_ENDPOINT_VARS = ("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT", "OTEL_EXPORTER_OTLP_ENDPOINT")
_HEADER_VARS = ("OTEL_EXPORTER_OTLP_METRICS_HEADERS", "OTEL_EXPORTER_OTLP_HEADERS")


def otlp_metrics_endpoint() -> str | None:
    """The OTLP endpoint metrics go to, when one is set (the exporter reads the same variables)."""
    for name in _ENDPOINT_VARS:
        value = os.environ.get(name, "").strip()
        if value:
            return value
    return None


def _unit(name: str) -> str:
    if name.endswith("_seconds") or "_seconds_" in name:
        return "s"
    if name.endswith("_usd") or "_usd_" in name:
        return "USD"
    return "1"


def to_metrics_data(families: Iterable[Any], *, start_ns: int, now_ns: int, resource: dict[str, str]) -> MetricsData:
    """OTLP ``MetricsData`` of ``prometheus_client`` metric families (one collect())."""
    from opentelemetry.sdk.metrics.export import (
        AggregationTemporality,
        Gauge,
        Histogram,
        HistogramDataPoint,
        Metric,
        MetricsData,
        NumberDataPoint,
        ResourceMetrics,
        ScopeMetrics,
        Sum,
    )
    from opentelemetry.sdk.resources import Resource
    from opentelemetry.sdk.util.instrumentation import InstrumentationScope

    cumulative = AggregationTemporality.CUMULATIVE
    metrics = []
    for family in families:
        if family.type == "counter":
            points = [
                NumberDataPoint(dict(s.labels), start_ns, now_ns, s.value)
                for s in family.samples
                if s.name.endswith("_total")
            ]
            if points:
                name = f"{family.name}_total"
                metrics.append(Metric(name, family.documentation, _unit(name), Sum(points, cumulative, True)))
        elif family.type == "gauge":
            points = [NumberDataPoint(dict(s.labels), start_ns, now_ns, s.value) for s in family.samples]
            if points:
                metrics.append(Metric(family.name, family.documentation, _unit(family.name), Gauge(points)))
        elif family.type == "histogram":
            hist_points = _histogram_points(family, start_ns, now_ns, HistogramDataPoint)
            if hist_points:
                metrics.append(
                    Metric(family.name, family.documentation, _unit(family.name), Histogram(hist_points, cumulative))
                )
    scope = ScopeMetrics(InstrumentationScope("tracescore.worker"), metrics, "")
    return MetricsData([ResourceMetrics(Resource.create(resource), [scope], "")])


def _histogram_points(family: Any, start_ns: int, now_ns: int, point: Any) -> list[Any]:
    # Prometheus buckets are cumulative ("le"), OTLP's are per bucket; +Inf is the last one.
    series: dict[tuple[tuple[str, str], ...], dict[str, Any]] = defaultdict(lambda: {"buckets": []})
    for s in family.samples:
        labels = tuple(sorted((k, v) for k, v in s.labels.items() if k != "le"))
        entry = series[labels]
        if s.name.endswith("_bucket"):
            entry["buckets"].append((float(s.labels["le"]), s.value))
        elif s.name.endswith("_sum"):
            entry["sum"] = s.value
        elif s.name.endswith("_count"):
            entry["count"] = s.value
    points = []
    for labels, entry in series.items():
        buckets = sorted(entry["buckets"])
        bounds = [le for le, _ in buckets if not math.isinf(le)]
        counts, previous = [], 0.0
        for _, cumulative in buckets:
            counts.append(int(cumulative - previous))
            previous = cumulative
        points.append(
            point(
                attributes=dict(labels),
                start_time_unix_nano=start_ns,
                time_unix_nano=now_ns,
                count=int(entry.get("count", previous)),
                sum=entry.get("sum", 0.0),
                bucket_counts=counts,
                explicit_bounds=bounds,
                # Prometheus keeps no min/max: the fields stay unset in the protobuf.
                min=None,
                max=None,
            )
        )
    return points


class OtlpMetricsPusher:
    """A daemon thread exporting ``registry`` every ``interval_s`` (and once more at ``stop``).

    The default exporter's headers are checked first: one it cannot read is a ``ValueError``
    naming the variable and the header (the exporter would drop it, logging its value)."""

    def __init__(
        self,
        registry: Collector,
        resource: dict[str, str],
        interval_s: float,
        exporter: MetricExporter | None = None,
    ) -> None:
        if exporter is None:
            from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter

            from tracing.sinks import otlp_headers_problem

            problem = otlp_headers_problem(_HEADER_VARS)
            if problem:
                raise ValueError(problem)
            exporter = OTLPMetricExporter()
        self._exporter = exporter
        self._registry = registry
        self._resource = resource
        self._interval_s = interval_s
        self._start_ns = time.time_ns()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="tracescore-otlp-metrics", daemon=True)

    def start(self) -> None:
        self._thread.start()

    def export_once(self) -> bool:
        """Collect and send now; False when the exporter reported a failure (it logs why)."""
        from opentelemetry.sdk.metrics.export import MetricExportResult

        try:
            data = to_metrics_data(
                self._registry.collect(), start_ns=self._start_ns, now_ns=time.time_ns(), resource=self._resource
            )
            result = self._exporter.export(data, timeout_millis=10_000)
        except Exception as exc:  # a metrics push must never take the worker down
            log.warning("otlp_metrics_export_failed", error=type(exc).__name__)
            return False
        return bool(result == MetricExportResult.SUCCESS)

    def _run(self) -> None:
        while not self._stop.wait(self._interval_s):
            self.export_once()

    def stop(self, timeout_s: float = 10.0) -> None:
        if self._thread.is_alive():
            self._stop.set()
            self._thread.join(timeout_s)
            self.export_once()  # what happened since the last interval
        self._exporter.shutdown(timeout_millis=int(timeout_s * 1000))
