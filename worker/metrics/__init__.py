"""What the worker nodes tell about themselves: Prometheus metrics and the same through OTLP.

Owns the metric definitions and the one recording API the rest of the worker calls
(``observe_*``, ``judge_request_context``), each node's ``/metrics``
endpoint (``TRACESCORE_METRICS_PORT``; the parent process serves the sum of its prefork
children through ``prometheus_client``'s multiprocess files), the gauges read from Redis at
scrape time (queue depth and age, dead letters, the sinks' outbox, today's spend against the
budgets), and the OTLP push of the
same registry when ``OTEL_EXPORTER_OTLP_(METRICS_)ENDPOINT`` is set.

``ALL_METRICS`` lists every metric a node exposes (dashboards and alerts are tested against it).
"""

from worker.metrics._collector import SCRAPED, RedisStateCollector, oldest_enqueued_at
from worker.metrics._instruments import (
    RECORDED,
    MetricSpec,
    judge_request_context,
    observe_batch,
    observe_broadcast_refused,
    observe_judge_usage,
    observe_key_repairs,
    observe_limiter_wait,
    observe_records,
    observe_skipped,
    observe_unreadable,
    process_started,
)
from worker.metrics._node import MetricsStep, NodeMetrics, start_node_metrics, stop_node_metrics
from worker.metrics._otlp import OtlpMetricsPusher, otlp_metrics_endpoint, to_metrics_data

ALL_METRICS: tuple[MetricSpec, ...] = RECORDED + SCRAPED

__all__ = [
    "ALL_METRICS",
    "MetricSpec",
    "MetricsStep",
    "NodeMetrics",
    "OtlpMetricsPusher",
    "RedisStateCollector",
    "judge_request_context",
    "observe_batch",
    "observe_broadcast_refused",
    "observe_judge_usage",
    "observe_key_repairs",
    "observe_limiter_wait",
    "observe_records",
    "observe_skipped",
    "observe_unreadable",
    "oldest_enqueued_at",
    "otlp_metrics_endpoint",
    "process_started",
    "start_node_metrics",
    "stop_node_metrics",
    "to_metrics_data",
]
